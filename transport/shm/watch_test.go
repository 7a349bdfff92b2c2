package shm

import (
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestWaitForReusedDescriptor: a descriptor closed after one WaitFor and
// whose number then names another file (a device channel closed and made
// again, which got the same number) is watched in the next WaitFor that
// passes it: the poller dropped the old file at its close, so a WaitFor
// that kept it as watched, by its number, slept its timeout with the new
// file readable.
func TestWaitForReusedDescriptor(t *testing.T) {
	in, err := CreateInbox(filepath.Join(t.TempDir(), "in"), 1, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var a [2]int
	if err := unix.Pipe2(a[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(a[1])
	if err := in.WaitFor(in.Seq(), time.Millisecond, []int{a[0]}); err != nil {
		t.Fatal(err)
	}
	// Another pipe whose read end has a[0]'s number.
	var b [2]int
	if err := unix.Pipe2(b[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(b[1])
	if err := unix.Dup3(b[0], a[0], unix.O_CLOEXEC); err != nil { // closes a[0]'s file
		t.Fatal(err)
	}
	defer unix.Close(a[0])
	unix.Close(b[0])
	if _, err := unix.Write(b[1], []byte{1}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := in.WaitFor(in.Seq(), 2*time.Second, []int{a[0]}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d >= time.Second {
		t.Fatalf("WaitFor slept %v with the descriptor it was given readable (its number named another file before)", d)
	}
}

// TestWaitForClosedDescriptorStillOpen: a descriptor that WaitFor watched
// and its caller closed, its file living on in a duplicate, ends no later
// wait that does not pass it. Epoll keeps a registration while its file
// lives, and removing it by the closed number failed (EBADF), so every
// wait returned at once while the file was readable (20 of 20 before).
func TestWaitForClosedDescriptorStillOpen(t *testing.T) {
	in, err := CreateInbox(filepath.Join(t.TempDir(), "in"), 1, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var a, b [2]int
	for _, p := range []*[2]int{&a, &b} {
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			t.Fatal(err)
		}
	}
	defer unix.Close(a[1])
	defer unix.Close(b[0])
	defer unix.Close(b[1])
	if err := in.WaitFor(in.Seq(), time.Millisecond, []int{a[0]}); err != nil {
		t.Fatal(err)
	}
	keep, err := unix.Dup(a[0])
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(keep)
	unix.Close(a[0])
	if _, err := unix.Write(a[1], []byte{1}); err != nil { // readable, never read
		t.Fatal(err)
	}
	quick := 0
	for range 10 {
		start := time.Now()
		if err := in.WaitFor(in.Seq(), 20*time.Millisecond, []int{b[0]}); err != nil {
			t.Fatal(err)
		}
		if time.Since(start) < 10*time.Millisecond {
			quick++
		}
	}
	if quick > 2 {
		t.Fatalf("%d of 10 waits for another descriptor returned at once: the closed one is still watched", quick)
	}
	// The one watched now still wakes it.
	if _, err := unix.Write(b[1], []byte{1}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := in.WaitFor(in.Seq(), 2*time.Second, []int{b[0]}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d >= time.Second {
		t.Fatalf("WaitFor slept %v with its descriptor readable", d)
	}
}
