//go:build linux

package softhca_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

// envSilent makes the test binary a device that is not one: it listens on
// DIR/soft0.sock, accepts, reports every request and answers none.
const envSilent = "XRC_TEST_SILENT_DEVICE"

// silentDevice listens as TestMain's envSilent role, or in a goroutine
// (ready is called once it listens). It returns when its listener closes.
func silentDevice(dir string, ready func(), report func(string)) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, "soft0.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return err
	}
	defer ln.Close()
	os.Chmod(path, 0o777)
	ready()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			buf, oob := make([]byte, 1<<16), make([]byte, 256)
			for {
				n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
				if err != nil || n == 0 {
					return
				}
				report(fmt.Sprintf("a request of %d bytes and %d bytes of descriptors", n, oobn))
			}
		}()
	}
}

func silentDeviceMain(dir string) int {
	err := silentDevice(dir, func() { fmt.Println("listening") }, func(s string) { fmt.Println(s) })
	fmt.Println(err)
	return 1
}

// TestAttachChecksTheDevice: a client attaches only to a device run by its
// own user or root. Another local user who made the runtime directory
// first (/tmp/xrc-UID may be made by anyone) and put a socket there used
// to get the client's hello and then its queue memory. Needs root, to run
// the other user's device.
func TestAttachChecksTheDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run a device as another user")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("needs setpriv (util-linux)")
	}
	parent, err := os.MkdirTemp("", "xrc-foreign-") // in /tmp: the other user must reach it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o777); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "xrc-0")
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envSilent+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "listening" {
		t.Fatalf("the other user's device: %q", sc.Text())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k, err := softhca.Attach(ctx, dir, "soft0")
	if err == nil {
		k.Close()
	}
	if !errors.Is(err, syscall.EACCES) {
		t.Fatalf("attach to user 65534's device: %v", err)
	}
	// And a device will not serve from that directory.
	d := newDevice(t, softhca.NewFabric())
	refused, cancelRefused := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelRefused()
	if err := d.Serve(refused, dir); err == nil || !strings.Contains(err.Error(), "belongs to user 65534") {
		t.Fatalf("serve in user 65534's directory: %v", err)
	}
}

// TestRuntimeDirChecked: a device does not serve from a directory others
// may write to (unless sticky, as /tmp is); a symbolic link to a directory
// of its user's is the directory.
func TestRuntimeDirChecked(t *testing.T) {
	d := newDevice(t, softhca.NewFabric())
	// Serve returns at once with the error, or at the deadline if it
	// served. A link to a directory of this user's is fine.
	refused, cancelRefused := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelRefused()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	if err := d.Serve(refused, open); err == nil || !strings.Contains(err.Error(), "may be written by other users") {
		t.Fatalf("serve in a directory of mode 0777: %v", err)
	}
	sticky := filepath.Join(t.TempDir(), "sticky")
	if err := os.Mkdir(sticky, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sticky, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{sticky, link} {
		ctx, cancel := context.WithCancel(ctx)
		served := make(chan error, 1)
		go func() { served <- d.Serve(ctx, dir) }()
		waitSocket(t, filepath.Join(dir, d.Name()+".sock"), served)
		cancel()
		if err := <-served; err != nil {
			t.Fatalf("serve in %s: %v", dir, err)
		}
	}
}

// TestAskBounded: listing or querying a device that accepts and never
// answers (stopped, stuck) ends with the caller's context; it hung, and
// with it verbs.Devices and xrcrun devices.
func TestAskBounded(t *testing.T) {
	dir := t.TempDir()
	listening := make(chan struct{})
	got := make(chan string, 16)
	go silentDevice(dir, func() { close(listening) }, func(s string) { got <- s })
	<-listening
	t.Cleanup(func() { os.Remove(filepath.Join(dir, "soft0.sock")) })
	// A context that ends before the dial says so, not "no device".
	expired, cancelExpired := context.WithTimeout(context.Background(), -time.Second)
	defer cancelExpired()
	if _, err := softhca.QueryCounters(expired, dir, "soft0"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("query with a context already ended: %v", err)
	}
	for _, call := range []func(ctx context.Context) error{
		func(ctx context.Context) error { _, err := softhca.QueryCounters(ctx, dir, "soft0"); return err },
		func(ctx context.Context) error {
			k, err := softhca.Attach(ctx, dir, "soft0")
			if err == nil {
				k.Close()
			}
			return err
		},
	} {
		// Long enough for the dial on a loaded machine: the request
		// must reach the device, which then keeps the caller waiting.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		done := make(chan error, 1)
		go func() { done <- call(ctx) }()
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("asked a device that does not answer: %v", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("still waiting for a device that does not answer, a minute on")
		}
		cancel()
		select {
		case <-got: // it was asked
		case <-time.After(time.Minute):
			t.Fatal("the device was never asked")
		}
	}
}

// waitSocket waits for the socket at path, failing if served returns first.
func waitSocket(t *testing.T, path string, served <-chan error) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case err := <-served:
			t.Fatalf("Serve returned: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket %s", path)
		}
	}
}

// TestAttachDialCause: a socket that is there but cannot be connected to
// for another reason than "nobody listens" (here a stream socket where the
// device's is a packet one; EACCES for a directory the user may not
// enter) is reported with that reason, not as a device that is not
// running.
func TestAttachDialCause(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(dir, "soft0.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = softhca.Attach(context.Background(), dir, "soft0")
	if err == nil {
		t.Fatal("attached to a stream socket")
	}
	if errors.Is(err, verbs.ErrNoDevice) || strings.Contains(err.Error(), "running?") {
		t.Errorf("a socket of the wrong type is reported as no device: %v", err)
	}
	if !errors.Is(err, syscall.EPROTOTYPE) {
		t.Errorf("the cause is lost: %v", err)
	}
	// Nothing at the path at all is still "no device".
	if _, err := softhca.Attach(context.Background(), dir, "soft1"); !errors.Is(err, verbs.ErrNoDevice) {
		t.Errorf("attach to a name with no socket: %v, want ErrNoDevice", err)
	}
}
