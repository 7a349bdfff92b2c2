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

// TestRingCorrupt: impossible control words and lengths stop the consumer
// with ErrCorrupt, for good.
func TestRingCorrupt(t *testing.T) {
	for name, mess := range map[string]func(mem []byte){
		"tail too far":     func(mem []byte) { word(mem, tailOff).Store(1 << 20) },
		"length too large": func(mem []byte) { binary.LittleEndian.PutUint32(mem[ringCtl:], 4000); word(mem, tailOff).Store(64) },
		"length past tail": func(mem []byte) { binary.LittleEndian.PutUint32(mem[ringCtl:], 100); word(mem, tailOff).Store(16) },
	} {
		_, c, mem := newTestRing(t, 4096)
		mess(mem)
		if _, err := c.Next(); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
		if _, err := c.Next(); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: second call: %v", name, err)
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
	f.Fuzz(func(t *testing.T, head uint64, b []byte) {
		_, _, mem := newTestRing(t, 4096)
		copy(mem, b)
		word(mem, headOff).Store(head)
		c := NewConsumer(mem)
		for range 64 {
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
