package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// A ring carries frames from one producer process to one consumer process
// through shared memory. It is three control words, each on cache lines of
// its own, and a data area whose size is a power of two:
//
//	+0    tail: bytes ever written (the producer's; the consumer reads it
//	      only to check it and to decide whether to sleep: Pending)
//	+128  head: bytes ever consumed (the consumer's; the producer reads it)
//	+192  blocked: non-zero once the producer found the ring full; the
//	      consumer that makes room clears it and wakes the producer
//	+256  data
//
// A frame is an 8-byte header then the payload, padded to a multiple of 8.
// The header is one little-endian 64-bit word: the payload length in the
// low 32 bits and, in the high 32, the frame's stamp, stamp(pos) =
// uint32(pos>>3) | 1<<31 for the frame at ring position pos (bytes ever
// written before it). A frame never wraps: when it does not fit before the
// end of the data area, the producer writes a wrap marker there (length
// 0xffffffff, with the stamp of its own position) and the frame at the
// start.
//
// The header is what publishes a frame: the producer writes the payload,
// then the header with one atomic store, then tail. The consumer waits on
// the header at its position, on the same cache line as a small frame's
// payload, not on tail: a frame costs it one line from the producer's
// cache, not two in a row. So that the bytes there before the header (an
// earlier lap's payload) never pass for one, the slot after each frame is
// zero before the frame is published: the producer zeroes it when it
// reserves the frame, for which a frame needs 8 bytes of room beyond its
// own; the slot at the start of the area after a wrap marker holds the
// next frame's header before the marker is published. The slot at the
// consumer's position is thus zero (nothing yet) or the header of the
// frame there, with its stamp; the stamp (never zero) also tells a frame
// of no bytes from an empty slot.
//
// The consumer trusts nothing in the ring: the peer process may be buggy
// or hostile. A header with another stamp, a length out of range, a frame
// that crosses the end of the data area, a tail that moved backwards or
// too far, or a tail ahead of a frame that is not there marks the ring
// corrupt (ErrCorrupt) and the consumer reads no more from it; it never
// reads outside the mapping. It reads tail when it finds no frame (every
// 64th time in Next; always in Pending).
const (
	ringCtl     = 256
	frameHdr    = 8
	wrapMarker  = 0xffffffff
	tailOff     = 0
	headOff     = 128
	blockedOff  = 192
	minRingData = 4096
)

// ErrCorrupt reports a ring whose control words or frame headers are
// impossible: the peer wrote outside the protocol.
var ErrCorrupt = errors.New("shm: corrupt ring")

// ErrTooLarge reports a frame larger than a ring can ever hold.
var ErrTooLarge = errors.New("shm: frame larger than the ring allows")

// ringBytes is the size of a ring with data bytes of data.
func ringBytes(data int) int { return ringCtl + data }

func align8(n int) int { return (n + 7) &^ 7 }

// word returns the 64-bit control word at off of b, which must be 8-byte
// aligned (mappings are page aligned and offsets multiples of 8).
func word(b []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&b[off]))
}

// Producer writes frames into a ring. Only one goroutine of one process
// may use it at a time. Its memory belongs to the mapping it was made on.
type Producer struct {
	tail, head *atomic.Uint64
	blocked    *atomic.Uint64
	data       []byte
	mask       uint64
	pos        uint64 // the tail this producer has written up to
	headSeen   uint64 // the last head read
	res        int    // length of the reserved frame's payload, -1 when none
}

// Consumer reads frames from a ring. Only one goroutine of one process may
// use it at a time.
type Consumer struct {
	tail, head *atomic.Uint64
	blocked    *atomic.Uint64
	data       []byte
	mask       uint64
	pos        uint64 // the head this consumer has read up to
	cur        uint64 // the ring bytes of the frame Next returned
	idle       uint32 // Next's calls that found no frame, mod 2^32
	err        error
}

func newRing(b []byte) (tail, head, blocked *atomic.Uint64, data []byte) {
	return word(b, tailOff), word(b, headOff), word(b, blockedOff), b[ringCtl:]
}

// NewProducer returns the producer of the ring in b (ringBytes(n) bytes
// for a power-of-two n at least minRingData).
func NewProducer(b []byte) *Producer {
	t, h, bl, d := newRing(b)
	p := &Producer{tail: t, head: h, blocked: bl, data: d, mask: uint64(len(d) - 1), res: -1}
	p.pos = t.Load()
	p.headSeen = h.Load()
	return p
}

// NewConsumer returns the consumer of the ring in b.
func NewConsumer(b []byte) *Consumer {
	t, h, bl, d := newRing(b)
	c := &Consumer{tail: t, head: h, blocked: bl, data: d, mask: uint64(len(d) - 1), pos: h.Load()}
	if c.pos%frameHdr != 0 {
		c.corrupt("head %d not a multiple of %d", c.pos, frameHdr)
	}
	return c
}

// stamp is the high half of the header of the frame (or wrap marker) at
// ring position pos: never zero, and not the same for the slots of one
// offset in 2^31 laps.
func stamp(pos uint64) uint64 { return uint64(uint32(pos>>3)|1<<31) << 32 }

// skip is the bytes a wrap marker fills before a frame of need bytes at
// the producer's position: the rest of the data area if the frame does not
// fit before its end, else 0.
func (p *Producer) skip(need uint64) uint64 {
	off, size := p.pos&p.mask, uint64(len(p.data))
	if off+need > size {
		return size - off
	}
	return 0
}

// MaxFrame is the largest payload a ring of this size carries: a quarter
// of its data, so that several frames are in flight at once.
func (p *Producer) MaxFrame() int { return len(p.data)/4 - frameHdr }

// Reserve returns room for a frame of n payload bytes in the ring, to be
// filled and then published with Commit, or nil if the ring has no room
// now (the consumer is behind). The slice aliases the shared mapping: the
// caller writes it and keeps no reference after Commit.
func (p *Producer) Reserve(n int) ([]byte, error) {
	if n < 0 || n > p.MaxFrame() {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, n, p.MaxFrame())
	}
	need := uint64(frameHdr + align8(n))
	size := uint64(len(p.data))
	skip := p.skip(need)
	// The frame, and the slot after it, which is zeroed now: the header
	// that comes there must be the first thing the consumer sees in it.
	room := p.pos + skip + need + frameHdr
	if room-p.headSeen > size {
		p.headSeen = p.head.Load()
		if room-p.headSeen > size {
			// Full: say so, then look again. A consumer that made room
			// meanwhile either is seen here or sees the mark (both are
			// sequentially consistent) and wakes this producer.
			if p.blocked.Load() == 0 { // a producer that retries writes it once
				p.blocked.Store(1)
			}
			p.headSeen = p.head.Load()
			if room-p.headSeen > size {
				return nil, nil
			}
		}
	}
	// With a skip, the frame goes at the start, and the wrap marker is
	// published in Commit, after it: the slot there holds stale bytes
	// until then.
	off := (p.pos + skip) & p.mask
	// The next slot: off+need is at most size, and 0 at the end.
	binary.LittleEndian.PutUint64(p.data[(off+need)&p.mask:], 0)
	p.res = n
	return p.data[off+frameHdr : off+frameHdr+uint64(n) : off+frameHdr+uint64(n)], nil
}

// Commit publishes the frame Reserve returned: the consumer may read it
// from now on.
func (p *Producer) Commit() {
	if p.res < 0 {
		panic("shm: Commit without Reserve")
	}
	need := uint64(frameHdr + align8(p.res))
	skip := p.skip(need)
	start := p.pos + skip
	word(p.data, int(start&p.mask)).Store(uint64(p.res) | stamp(start))
	if skip > 0 {
		word(p.data, int(p.pos&p.mask)).Store(wrapMarker | stamp(p.pos))
	}
	p.pos = start + need
	p.res = -1
	p.tail.Store(p.pos)
}

// Write publishes one frame made of the parts, in order. It returns false
// when the ring has no room now.
func (p *Producer) Write(parts ...[]byte) (bool, error) {
	n := 0
	for _, b := range parts {
		n += len(b)
	}
	f, err := p.Reserve(n)
	if f == nil || err != nil {
		return false, err
	}
	off := 0
	for _, b := range parts {
		off += copy(f[off:], b)
	}
	p.Commit()
	return true, nil
}

// Next returns the payload of the next frame, or nil if there is none yet.
// The slice aliases the shared mapping and stays valid until Release; the
// producer may not overwrite it before then. A corrupt ring returns
// ErrCorrupt, now and on every later call.
func (c *Consumer) Next() ([]byte, error) {
	if c.err != nil {
		return nil, c.err
	}
	size := uint64(len(c.data))
	for {
		off := c.pos & c.mask
		h := word(c.data, int(off)).Load()
		if h == 0 {
			if c.idle++; c.idle&63 != 1 {
				return nil, nil
			}
			if more, err := c.checkTail(); !more || err != nil {
				return nil, err
			}
			continue
		}
		if h&^0xffffffff != stamp(c.pos) {
			return nil, c.corrupt("header %#x at %d, want stamp %#x", h, c.pos, stamp(c.pos)>>32)
		}
		n := uint32(h)
		if n == wrapMarker {
			// The rest of the area is skipped; the frame at the start is
			// never one.
			if off == 0 {
				return nil, c.corrupt("wrap marker at the start, position %d", c.pos)
			}
			c.pos += size - off
			continue
		}
		need := uint64(frameHdr + align8(int(n)))
		if int(n) > len(c.data)/4-frameHdr || off+need > size {
			return nil, c.corrupt("frame of %d bytes at %d", n, off)
		}
		c.cur = need
		return c.data[off+frameHdr : off+frameHdr+uint64(n) : off+frameHdr+uint64(n)], nil
	}
}

// checkTail reads tail, having found no frame at the consumer's position,
// and reports whether one is there now. The producer publishes a frame's
// header before the tail that covers it: a tail past the position with
// no header there is corrupt. It may lag: the consumer may have taken a
// frame whose tail is not stored yet, at most one frame and the skip of
// its wrap, less than half the area.
func (c *Consumer) checkTail() (bool, error) {
	tail := c.tail.Load()
	size := uint64(len(c.data))
	switch ahead, behind := tail-c.pos, c.pos-tail; {
	case ahead == 0:
		return false, nil
	case ahead <= size:
		if word(c.data, int(c.pos&c.mask)).Load() != 0 {
			return true, nil
		}
		return false, c.corrupt("tail %d, head %d, and no frame there", tail, c.pos)
	case behind <= size/2:
		return false, nil
	default:
		return false, c.corrupt("tail %d, head %d", tail, c.pos)
	}
}

// Release gives the frame Next returned back to the producer.
func (c *Consumer) Release() {
	if c.cur == 0 {
		panic("shm: Release without Next")
	}
	c.pos += c.cur
	c.cur = 0
	c.head.Store(c.pos)
}

// Unblocked reports, once, that the producer had found the ring full since
// the last call: the caller, which has made room, wakes it.
func (c *Consumer) Unblocked() bool {
	return c.blocked.Load() != 0 && c.blocked.Swap(0) != 0
}

// Pending reports whether a frame may be waiting. A ring found corrupt is
// not: nothing more is read from it, whatever its producer writes, so it
// must not keep its owner awake; Pending checks tail (checkTail), and a
// ring it finds corrupt is pending this once, for Next to report it.
func (c *Consumer) Pending() bool {
	if c.err != nil {
		return false
	}
	if word(c.data, int(c.pos&c.mask)).Load() != 0 {
		return true
	}
	more, err := c.checkTail()
	return more || err != nil
}

func (c *Consumer) corrupt(format string, args ...any) error {
	c.err = fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
	return c.err
}
