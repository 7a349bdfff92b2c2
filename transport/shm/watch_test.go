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
