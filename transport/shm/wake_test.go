package shm

import (
	"testing"

	"github.com/xrcrun/xrc/transport"
)

// chainReader starts the next Read from ReadDone, as a handler may (a pull
// completing lets the next queued one start).
type chainReader struct {
	t    *testing.T
	tr   *Transport
	src  transport.Remote
	dst  []byte
	left int
	done map[uint64]error
}

func (c *chainReader) Deliver(int, []byte) {}

func (c *chainReader) ReadDone(cookie uint64, err error) {
	c.done[cookie] = err
	if c.left > 0 {
		c.left--
		if err := c.tr.Read(0, c.dst, c.src, cookie+1); err != nil {
			c.t.Fatal(err)
		}
	}
}

// TestReadFromReadDone: a Read that ReadDone starts is reported by a later
// Progress. Progress cleared its list of finished Reads after calling
// ReadDone, and the new one with it.
func TestReadFromReadDone(t *testing.T) {
	ts := node(t, 2)
	src := []byte("hello, world")
	rm, err := ts[0].Expose(src)
	if err != nil {
		t.Fatal(err)
	}
	h := &chainReader{t: t, tr: ts[1], src: rm, dst: make([]byte, len(src)), left: 1, done: map[uint64]error{}}
	if err := ts[1].Read(0, h.dst, rm, 1); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := ts[1].Progress(h); err != nil {
			t.Fatal(err)
		}
	}
	if err, ok := h.done[2]; !ok || err != nil {
		t.Fatalf("the Read started in ReadDone: %v, %v (all: %v)", ok, err, h.done)
	}
}

// TestRoomRingsTheBell: a receiver that makes room in a full ring rings
// its sender's bell, even if the sender does not sleep yet. A sender reads
// its bell, finds the ring full and then sleeps from what it read: a
// wake-up only for a sender already asleep missed one about to sleep, and
// it slept its whole timeout with room in the ring.
func TestRoomRingsTheBell(t *testing.T) {
	ts := node(t, 2)
	sender, receiver := ts[0], ts[1]
	seq := sender.Bell().Seq()
	for {
		ok, err := sender.TrySend(1, make([]byte, 500))
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
	}
	if _, err := receiver.Progress(&collector{frames: map[int][][]byte{}, reads: map[uint64]error{}}); err != nil {
		t.Fatal(err)
	}
	if sender.Bell().Seq() == seq {
		t.Fatal("room in the sender's ring, and its bell did not ring: WaitFrom(seq) would sleep")
	}
}
