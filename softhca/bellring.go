//go:build linux

package softhca

import (
	"encoding/binary"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/xrcrun/xrc/internal/unix"
)

// A bell ring carries the doorbell writes of a client in another process to
// the device: a ring of UAR writes in shared memory that the client produces
// and the engine consumes, plus an eventfd the device reads for this client
// alone, which the client signals only when the engine said it was going to sleep. A busy engine
// thus takes doorbells with no system call at all (virtio-style
// notification suppression).
//
// Layout of the shared memory (host byte order; the words are used with
// atomic operations from both processes):
//
//	0     tail      uint32: entries the client has written
//	64    head      uint32: entries the engine has taken
//	128   sleeping  uint32: 1 while the engine sleeps or is about to
//	4096  entries   [bellEntries]struct{ off uint32; _ uint32; v uint64 }
const (
	bellTail     = 0
	bellHead     = 64
	bellSleeping = 128
	bellHeader   = 4096
	bellEntries  = 4096 // a power of two
	bellEntry    = 16
	bellSize     = bellHeader + bellEntries*bellEntry
)

// bellRing is one side's view of a ring's shared memory. The memory is
// mapped by whoever made the view and unmapped by its close.
type bellRing struct {
	mem      []byte
	tail     *atomic.Uint32
	head     *atomic.Uint32
	sleeping *atomic.Uint32
}

func newBellRing(mem []byte) *bellRing {
	word := func(off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&mem[off])) }
	return &bellRing{mem: mem, tail: word(bellTail), head: word(bellHead), sleeping: word(bellSleeping)}
}

func (r *bellRing) entry(i uint32) []byte {
	off := bellHeader + int(i&(bellEntries-1))*bellEntry
	return r.mem[off : off+bellEntry]
}

// bellProducer is the client's end: it writes UAR writes into the ring, in
// program order across the client's goroutines.
type bellProducer struct {
	mu   sync.Mutex
	r    *bellRing   // guarded by mu; nil once closed
	kick int         // the eventfd the device gave this client
	gone func() bool // reports that the device has gone: a full ring will not drain
}

// ring writes a doorbell. Once the client closed, or the device has gone
// (its QPs are in the error state then), doorbells are dropped.
func (p *bellProducer) ring(off int, v uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.r == nil {
		return
	}
	t := p.r.tail.Load()
	for spins := 1; t-p.r.head.Load() >= bellEntries; spins++ {
		// Full: the engine is behind. Make sure it is awake and wait,
		// unless it has stopped.
		if spins%1024 == 0 && p.gone() {
			return
		}
		p.wake()
		runtime.Gosched()
	}
	e := p.r.entry(t)
	binary.NativeEndian.PutUint32(e[0:], uint32(off))
	binary.NativeEndian.PutUint64(e[8:], v)
	p.r.tail.Store(t + 1)
	p.wake()
}

// close drops the ring, once no doorbell is being written, and returns
// its memory for the caller to unmap.
func (p *bellProducer) close() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	mem := p.r.mem
	p.r = nil
	return mem
}

// wake signals the eventfd if the engine sleeps, once per sleep: the
// engine sets sleeping before it checks the ring for the last time, and the
// client checks it after publishing, so one of the two sees the other.
func (p *bellProducer) wake() {
	if p.r.sleeping.Load() != 0 && p.r.sleeping.CompareAndSwap(1, 0) {
		unix.Signal(p.kick)
	}
}

// take appends the doorbells written since the last take. A client that
// corrupts its ring's words loses its doorbells, counted, and nothing else:
// entries are checked by the engine like any doorbell.
func (r *bellRing) take(c *Client, head *uint32, out []doorbell, bad *atomic.Uint64) []doorbell {
	t := r.tail.Load()
	h := *head
	if t-h > bellEntries {
		bad.Add(uint64(t - h))
		h = t
	}
	for ; h != t; h++ {
		e := r.entry(h)
		out = append(out, doorbell{c: c, off: int(binary.NativeEndian.Uint32(e[0:])), v: binary.NativeEndian.Uint64(e[8:])})
	}
	*head = h
	r.head.Store(h)
	return out
}

// pending reports whether the ring holds doorbells not taken.
func (r *bellRing) pending(head uint32) bool { return r.tail.Load() != head }
