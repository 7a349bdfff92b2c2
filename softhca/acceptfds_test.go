//go:build linux

package softhca_test

import (
	"context"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
)

// acceptFailed is a log handler that reports the device's failed accepts.
type acceptFailed chan string

func (h acceptFailed) Enabled(context.Context, slog.Level) bool { return true }
func (h acceptFailed) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h acceptFailed) WithGroup(string) slog.Handler            { return h }
func (h acceptFailed) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "accept") {
		select {
		case h <- r.Message:
		default:
		}
	}
	return nil
}

// TestServeOutOfDescriptors: a device process out of descriptors cannot
// accept a connection, which clients can bring about (each connection and
// each completion channel holds some). The device must carry on, and take
// the connection once descriptors are free again; it stopped serving,
// failing every client's QPs.
func TestServeOutOfDescriptors(t *testing.T) {
	logged := make(acceptFailed, 1)
	d, err := softhca.New(context.Background(), softhca.Config{Name: "nofds", Addr: netip.MustParseAddr("127.7.4.3"), SpinIdle: -1,
		Logger: slog.New(logged)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	dir := t.TempDir()
	path := filepath.Join(dir, "nofds.sock")
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, dir) }()
	defer func() {
		cancel()
		<-served
	}()
	waitSocket(t, path, served)

	// The client's socket is made first; then no descriptor is left, and
	// the device's accept of its connection fails.
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	free, err := syscall.Dup(fd) // the lowest free descriptor number
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(free)
	low := lim
	low.Cur = uint64(free)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()
	if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		restore()
		t.Fatal(err)
	}
	select {
	case msg := <-logged:
		t.Logf("device logged %q", msg)
	case err := <-served:
		served <- err
		restore()
		t.Fatalf("Serve stopped when it could not accept a connection: %v", err)
	case <-time.After(time.Minute):
		restore()
		t.Log("no accept failed within a minute: a descriptor was freed meanwhile")
	}
	restore()
	if _, err := softhca.QueryCounters(context.Background(), dir, "nofds"); err != nil {
		t.Fatalf("the device no longer answers: %v", err)
	}
}
