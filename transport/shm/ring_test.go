package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
)

func newTestRing(t testing.TB, data int) (*Producer, *Consumer, []byte) {
	mem := make([]byte, ringBytes(data)+8)
	// Align like a mapping would be.
	off := 0
	for uintptrOf(mem[off:])%8 != 0 {
		off++
	}
	mem = mem[off : off+ringBytes(data)]
	return NewProducer(mem), NewConsumer(mem), mem
}

func frame(seq uint64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seq) ^ byte(i*31)
	}
	if n >= 8 {
		binary.LittleEndian.PutUint64(b, seq)
	}
	return b
}

// TestRingOrder writes frames of random sizes, wrapping many times, and
// reads each back intact and in order; a full ring refuses a frame and
// takes it once the consumer has released room.
func TestRingOrder(t *testing.T) {
	p, c, _ := newTestRing(t, 4096)
	rng := rand.New(rand.NewPCG(3, 4))
	var sent [][]byte
	next := 0
	read := func(max int) {
		for ; max > 0; max-- {
			got, err := c.Next()
			if err != nil {
				t.Fatal(err)
			}
			if got == nil {
				return
			}
			if !bytes.Equal(got, sent[next]) {
				t.Fatalf("frame %d: got %d bytes, want %d", next, len(got), len(sent[next]))
			}
			c.Release()
			next++
		}
	}
	for seq := uint64(0); seq < 20000; seq++ {
		f := frame(seq, rng.IntN(p.MaxFrame()+1))
		ok, err := p.Write(f[:len(f)/2], f[len(f)/2:])
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			read(1 << 30) // drained: now it must fit
			if next != len(sent) {
				t.Fatalf("read %d of %d frames", next, len(sent))
			}
			if ok, err = p.Write(f); !ok || err != nil {
				t.Fatalf("frame %d of %d bytes refused by an empty ring: %v", seq, len(f), err)
			}
		}
		sent = append(sent, f)
		read(rng.IntN(3))
	}
	read(1 << 30)
	if next != len(sent) {
		t.Fatalf("read %d of %d frames", next, len(sent))
	}
	if _, err := p.Reserve(p.MaxFrame() + 1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized frame: %v", err)
	}
}

// TestRingConcurrent runs a producer and a consumer goroutine.
func TestRingConcurrent(t *testing.T) {
	p, c, _ := newTestRing(t, 8192)
	const n = 100000
	var wg sync.WaitGroup
	wg.Go(func() {
		for seq := uint64(0); seq < n; {
			if ok, err := p.Write(frame(seq, 8+int(seq%200))); err != nil {
				t.Error(err)
				return
			} else if ok {
				seq++
			} else {
				runtime.Gosched() // full: let the consumer run on a busy machine
			}
		}
	})
	for seq := uint64(0); seq < n; {
		got, err := c.Next()
		if err != nil {
			t.Fatal(err)
		}
		if got == nil {
			runtime.Gosched()
			continue
		}
		if !bytes.Equal(got, frame(seq, 8+int(seq%200))) {
			t.Fatalf("frame %d differs", seq)
		}
		c.Release()
		seq++
	}
	wg.Wait()
}

// TestRingCorrupt: impossible control words and headers stop the
// consumer with ErrCorrupt, for good; Pending finds those of tail too, and
// is then true once, so that its owner wakes and Next reports it.
func TestRingCorrupt(t *testing.T) {
	hdr := func(mem []byte, pos uint64, n uint64) { word(mem, ringCtl+int(pos&4095)).Store(n | stamp(pos)) }
	for name, mess := range map[string]func(mem []byte){
		"tail too far":     func(mem []byte) { word(mem, tailOff).Store(1 << 20) },
		"tail backwards":   func(mem []byte) { word(mem, headOff).Store(8192); word(mem, tailOff).Store(16) },
		"tail, no frame":   func(mem []byte) { word(mem, tailOff).Store(64) },
		"no stamp":         func(mem []byte) { binary.LittleEndian.PutUint32(mem[ringCtl:], 100); word(mem, tailOff).Store(112) },
		"wrong stamp":      func(mem []byte) { word(mem, ringCtl).Store(8 | stamp(4096)) },
		"length too large": func(mem []byte) { hdr(mem, 0, 4000) },
		"crosses the end":  func(mem []byte) { word(mem, headOff).Store(4096 - 64); hdr(mem, 4096-64, 100) },
		"wrap at start":    func(mem []byte) { hdr(mem, 0, wrapMarker) },
		"wrap, then bad": func(mem []byte) {
			hdr(mem, 0, 8)
			word(mem, ringCtl+16).Store(wrapMarker | stamp(16))
			hdr(mem, 4096, 1<<20)
		},
	} {
		_, c, mem := newTestRing(t, 4096)
		mess(mem)
		c = NewConsumer(mem)
		if !c.Pending() {
			t.Errorf("%s: not pending", name)
		}
		var err error
		for range 3 {
			if _, err = c.Next(); err != nil {
				break
			}
			c.Release()
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
		if _, err := c.Next(); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: second call: %v", name, err)
		}
		if c.Pending() {
			t.Errorf("%s: pending once found corrupt", name)
		}
	}
	// A tail behind the consumer by less than a frame and its wrap is the
	// producer between a frame's header and its tail.
	p, c, mem := newTestRing(t, 4096)
	p.Write(make([]byte, 100))
	word(mem, tailOff).Store(0)
	if f, err := c.Next(); len(f) != 100 || err != nil {
		t.Fatalf("frame before its tail: %d bytes, %v", len(f), err)
	}
	c.Release()
	if c.Pending() || c.err != nil {
		t.Fatalf("lagging tail: pending %v, %v", c.Pending(), c.err)
	}
}

// TestRingStalePayload: payloads made of the headers that would be valid
// at their slots a lap later are never taken for frames: the consumer,
// caught up or behind, reads only what was sent.
func TestRingStalePayload(t *testing.T) {
	p, c, _ := newTestRing(t, 4096)
	rng := rand.New(rand.NewPCG(5, 6))
	var sent [][]byte
	next := 0
	for seq := 0; seq < 20000; seq++ {
		n := 8 * rng.IntN(60)
		f, err := p.Reserve(n)
		if err != nil {
			t.Fatal(err)
		}
		if f != nil {
			pos := p.pos + p.skip(uint64(frameHdr+align8(n)))
			for i := 0; i < n; i += 8 {
				q := pos + frameHdr + uint64(i) + 4096*uint64(1+rng.IntN(2))
				binary.LittleEndian.PutUint64(f[i:], uint64(rng.IntN(64))|stamp(q))
			}
			sent = append(sent, append([]byte(nil), f...))
			p.Commit()
		}
		full := f == nil // then read one frame at least
		for k := rng.IntN(3); k > 0 || full; k-- {
			got, err := c.Next()
			if err != nil {
				t.Fatalf("frame %d: %v", next, err)
			}
			if got == nil {
				if next != len(sent) {
					t.Fatalf("frame %d of %d not seen", next, len(sent))
				}
				break
			}
			if next >= len(sent) || !bytes.Equal(got, sent[next]) {
				t.Fatalf("frame %d: got %d bytes, not the ones sent", next, len(got))
			}
			c.Release()
			next++
			full = false
		}
	}
}

// FuzzConsumer: whatever a peer writes into a ring, the consumer returns
// frames inside the data area or ErrCorrupt, and never panics.
func FuzzConsumer(f *testing.F) {
	_, _, mem := newTestRing(f, 4096)
	p := NewProducer(mem)
	p.Write([]byte("hello"))
	p.Write(make([]byte, 1000))
	f.Add(uint64(0), append([]byte(nil), mem[:ringCtl+2048]...))
	f.Add(uint64(4090), []byte{0xff, 0xff, 0xff, 0xff})
	_, _, mem = newTestRing(f, 4096)
	p = NewProducer(mem)
	for i := range 40 {
		p.Write(make([]byte, 100+i))
	}
	f.Add(uint64(4000), append([]byte(nil), mem...))
	f.Fuzz(func(t *testing.T, head uint64, b []byte) {
		_, _, mem := newTestRing(t, 4096)
		copy(mem, b)
		word(mem, headOff).Store(head)
		c := NewConsumer(mem)
		for range 64 {
			c.Pending()
			got, err := c.Next()
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatal(err)
				}
				return
			}
			if got == nil {
				return
			}
			start := uintptrOf(got) - uintptrOf(mem[ringCtl:])
			if start+uintptr(len(got)) > 4096 {
				t.Fatalf("frame of %d bytes at %d outside the data area", len(got), start)
			}
			c.Release()
		}
	})
}
