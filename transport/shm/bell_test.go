package shm

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestBellAcrossProcesses: frames echoed through another process wake
// each side from its sleep: the test sleeps only in WaitFor (no spin),
// and lets the peer fall asleep (its Wait lasts up to 1 s) before each
// frame. A bell that did not ring across processes made every round
// last the peer's second, or the test's 20 s.
func TestBellAcrossProcesses(t *testing.T) {
	pp := startPeer(t)
	const rounds = 20
	slow := 0
	for i := range rounds {
		time.Sleep(5 * time.Millisecond) // the peer's 50 µs spin is over
		start := time.Now()
		f := frame(uint64(i), 64)
		pp.send(t, f)
		c := pp.in.Ring(0)
		for {
			seq := pp.in.Seq()
			got, err := c.Next()
			if err != nil {
				t.Fatal(err)
			}
			if got != nil {
				c.Release()
				break
			}
			t0 := time.Now()
			if err := pp.in.WaitFor(seq, 20*time.Second, nil); err != nil {
				t.Fatal(err)
			}
			if time.Since(t0) >= 20*time.Second {
				t.Fatalf("round %d: the peer's echo did not wake the test", i)
			}
		}
		if time.Since(start) >= 500*time.Millisecond {
			slow++
		}
	}
	if slow > rounds/4 {
		t.Fatalf("%d of %d rounds took 500 ms or more: the test's frame did not wake the peer", slow, rounds)
	}
}

// TestWaitForDescriptor: WaitFor returns when a descriptor it was given
// becomes readable, and at once while it is; it does not empty it.
func TestWaitForDescriptor(t *testing.T) {
	in, err := CreateInbox(filepath.Join(t.TempDir(), "in"), 1, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	go func() {
		time.Sleep(10 * time.Millisecond)
		unix.Write(p[1], []byte{1})
	}()
	for i := range 3 {
		start := time.Now()
		if err := in.WaitFor(in.Seq(), 20*time.Second, []int{p[0]}); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d >= 10*time.Second {
			t.Fatalf("wait %d: %v, with the descriptor readable", i, d)
		}
	}
	// Without it, the wait lasts its timeout (the pipe stays in the
	// poller no more), unless kicked.
	start := time.Now()
	if err := in.WaitFor(in.Seq(), 20*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Fatalf("a wait without the readable descriptor returned after %v", d)
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		in.Kick()
	}()
	start = time.Now()
	if err := in.WaitFor(in.Seq(), 20*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d >= 10*time.Second {
		t.Fatalf("a Kick did not end the wait: %v", d)
	}
}

// TestCloseRemovesBell: Close removes the inbox's FIFO with its file, and
// a sender cannot open an inbox whose owner is gone.
func TestCloseRemovesBell(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "in")
	in, err := CreateInbox(path, 1, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path + bellSuffix); err != nil || fi.Mode()&os.ModeNamedPipe == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("bell: %v, %v", fi, err)
	}
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Fatalf("left after Close: %v, %v", ents, err)
	}
}
