//go:build linux

package unix

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMemfdSealed: a Memfd's size cannot change, so that the process it
// is passed to can map it safely, and Sealed tells such a file from one
// that may shrink.
func TestMemfdSealed(t *testing.T) {
	fd, b, err := Memfd("sealed", 10000)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(fd)
	defer Munmap(b)
	if err := unix.Ftruncate(fd, 0); !errors.Is(err, syscall.EPERM) {
		t.Errorf("shrink a Memfd: %v", err)
	}
	if err := unix.Ftruncate(fd, 1<<20); !errors.Is(err, syscall.EPERM) {
		t.Errorf("grow a Memfd: %v", err)
	}
	if err := Sealed(fd); err != nil {
		t.Errorf("Sealed(a Memfd): %v", err)
	}
	b[9999] = 1 // mapped and writable
	plain, err := unix.MemfdCreate("plain", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(plain)
	if err := Sealed(plain); err == nil {
		t.Error("Sealed(a memfd that may shrink) = nil")
	}
	f, err := os.CreateTemp(t.TempDir(), "file")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := Sealed(int(f.Fd())); err == nil {
		t.Error("Sealed(a regular file) = nil")
	}
}

// TestPeerClosed: a seqpacket socket whose peer is open, with a message
// waiting or not, is not closed; once the peer closes it is.
func TestPeerClosed(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "end")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	a, b := conn(fds[0]), conn(fds[1])
	defer a.Close()
	if PeerClosed(a) {
		t.Error("closed, with the peer open")
	}
	if _, err := b.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if PeerClosed(a) {
		t.Error("closed, with a message waiting")
	}
	buf := make([]byte, 4)
	if n, err := a.Read(buf); n != 1 || err != nil {
		t.Fatalf("the message was taken: %d, %v", n, err)
	}
	b.Close()
	if !PeerClosed(a) {
		t.Error("open, with the peer closed")
	}
}

// TestWatchExit: the watch fires once its process exits (before or after
// the process is reaped, and if it had exited before the watch began),
// not while it runs, and never once stopped.
func TestWatchExit(t *testing.T) {
	start := func() *exec.Cmd {
		cmd := exec.Command("sleep", "600")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	watch := func(cmd *exec.Cmd) (chan struct{}, func()) {
		fired := make(chan struct{})
		stop, err := WatchExit(cmd.Process.Pid, func() { close(fired) })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		return fired, stop
	}
	fires := func(what string, fired chan struct{}) {
		select {
		case <-fired:
		case <-time.After(time.Minute):
			t.Fatalf("%s: the watch did not fire", what)
		}
	}

	running := start()
	fired, _ := watch(running)
	select {
	case <-fired:
		t.Fatal("the watch fired while its process runs")
	case <-time.After(20 * time.Millisecond):
	}
	running.Process.Kill()
	fires("killed", fired)

	zombie := start()
	zombie.Process.Kill()
	for { // until it has exited, unreaped
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", zombie.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), ") Z ") {
			break
		}
		time.Sleep(time.Millisecond)
	}
	fired, _ = watch(zombie)
	fires("exited before the watch", fired)

	stopped := start()
	fired, stop := watch(stopped)
	stop()
	stopped.Process.Kill()
	stopped.Wait()
	select {
	case <-fired:
		t.Fatal("a stopped watch fired")
	case <-time.After(20 * time.Millisecond):
	}

	if _, err := WatchExit(stopped.Process.Pid, func() {}); err == nil {
		t.Error("a watch of a reaped process began")
	}
}
