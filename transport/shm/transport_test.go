package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/transport/internal/transporttest"
)

// collector is a Handler that keeps copies of what it is given.
type collector struct {
	frames map[int][][]byte
	reads  map[uint64]error
	failed map[int][]error // PeerFailed calls, by rank
}

func (c *collector) Deliver(rank int, f []byte) {
	c.frames[rank] = append(c.frames[rank], append([]byte(nil), f...))
}
func (c *collector) ReadDone(cookie uint64, err error) { c.reads[cookie] = err }
func (c *collector) PeerFailed(rank int, err error) {
	if c.failed == nil {
		c.failed = map[int][]error{}
	}
	c.failed[rank] = append(c.failed[rank], err)
}

// node makes the shm transports of n ranks on one node (and one rank of
// another node, which they must not reach) and connects them.
func node(t *testing.T, n int) []*Transport {
	return connectNode(t, n, func(int) Config { return Config{RingData: 4096} },
		transport.Peer{Rank: n, Node: 1, Record: []byte("elsewhere")})
}

// TestTransportAllToAll: every rank sends numbered frames to every rank of
// its node, itself included, more than a ring holds at once; each arrives
// once, in order per sender.
func TestTransportAllToAll(t *testing.T) {
	const n, msgs = 4, 300
	ts := node(t, n)
	if ts[0].Reaches(n) {
		t.Fatal("reaches a rank of another node")
	}
	if _, err := ts[0].TrySend(n, []byte("x")); !errors.Is(err, transport.ErrUnreachable) {
		t.Fatalf("send to another node: %v", err)
	}
	got := make([]*collector, n)
	for i := range got {
		got[i] = &collector{frames: map[int][][]byte{}, reads: map[uint64]error{}}
	}
	sent := make([][]int, n) // sent[from][to]
	for i := range sent {
		sent[i] = make([]int, n)
	}
	for progress := true; progress; {
		progress = false
		for from, tr := range ts {
			for to := range n {
				if sent[from][to] == msgs {
					continue
				}
				body := fmt.Appendf(nil, "%d>%d #%d %s", from, to, sent[from][to], bytes.Repeat([]byte{'.'}, sent[from][to]%700))
				ok, err := tr.TrySend(to, body[:5], body[5:])
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					sent[from][to]++
				}
				progress = true
			}
		}
		for i, tr := range ts {
			k, err := tr.Progress(got[i])
			if err != nil {
				t.Fatal(err)
			}
			progress = progress || k > 0
		}
	}
	for to := range n {
		for from := range n {
			fs := got[to].frames[from]
			if len(fs) != msgs {
				t.Fatalf("rank %d got %d frames from %d", to, len(fs), from)
			}
			for k, f := range fs {
				want := fmt.Appendf(nil, "%d>%d #%d %s", from, to, k, bytes.Repeat([]byte{'.'}, k%700))
				if !bytes.Equal(f, want) {
					t.Fatalf("rank %d, frame %d from %d: %q", to, k, from, f)
				}
			}
		}
	}
}

// TestTransportRead: a rank reads memory another exposed, and a Remote that
// does not cover the read, or names another process, is refused.
func TestTransportRead(t *testing.T) {
	ts := node(t, 2)
	src := make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i * 13)
	}
	r, err := ts[1].Expose(src)
	if err != nil {
		t.Fatal(err)
	}
	if len(r) > transport.MaxRemote {
		t.Fatalf("remote of %d bytes", len(r))
	}
	dst := make([]byte, len(src))
	if err := ts[0].Read(1, dst, r, 7); err != nil {
		t.Fatal(err)
	}
	c := &collector{frames: map[int][][]byte{}, reads: map[uint64]error{}}
	if _, err := ts[0].Progress(c); err != nil {
		t.Fatal(err)
	}
	if err, ok := c.reads[7]; !ok || err != nil {
		t.Fatalf("read completion: %v, %v", ok, err)
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("read data differs")
	}
	if err := ts[0].Read(1, make([]byte, len(src)+1), r, 8); !errors.Is(err, transport.ErrBadRemote) {
		t.Fatalf("read past the exposed memory: %v", err)
	}
	bad := append(transport.Remote(nil), r...)
	binary.LittleEndian.PutUint32(bad, 1) // pid 1
	if err := ts[0].Read(1, dst, bad, 9); !errors.Is(err, transport.ErrBadRemote) {
		t.Fatalf("read naming another process: %v", err)
	}
}

// TestTransportCorruptRing: a sender that scribbles over its ring fails
// at the receiver, without a crash: Progress goes on, and sends to it
// fail naming it (TestCorruptRingFailsOnlyItsPeer has the rest).
func TestTransportCorruptRing(t *testing.T) {
	ts := node(t, 2)
	o := ts[1].out[0]
	o.ring.tail.Store(1 << 40)
	c := &collector{frames: map[int][][]byte{}, reads: map[uint64]error{}}
	if _, err := ts[0].Progress(c); err != nil {
		t.Fatalf("progress over a corrupt ring: %v", err)
	}
	if _, err := ts[0].TrySend(1, []byte("x")); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("send to the rank whose ring is corrupt: %v", err)
	}
}

// TestAfterClose: a closed transport refuses every call; Progress used to
// index the rings Close had let go.
func TestAfterClose(t *testing.T) {
	ts := node(t, 2)
	transporttest.AfterClose(t, ts[0], 1)
}
