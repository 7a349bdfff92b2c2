//go:build linux

package unix

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"

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
