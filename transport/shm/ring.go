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
//	+0    tail: bytes ever written (the producer's; the consumer reads it)
//	+128  head: bytes ever consumed (the consumer's; the producer reads it)
//	+192  blocked: non-zero once the producer found the ring full; the
//	      consumer that makes room clears it and wakes the producer
//	+256  data
//
// A frame is an 8-byte header (the payload length, little endian, and four
// reserved bytes) then the payload, padded to a multiple of 8. A frame
// never wraps: when it does not fit before the end of the data area, the
// producer writes a wrap marker there and the frame at the start.
//
// The consumer trusts nothing in the ring: the peer process may be buggy
// or hostile. A length out of range or a tail that moved backwards or too
// far marks the ring corrupt (ErrCorrupt) and the consumer reads no more
// from it; it never reads outside the mapping.
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
	return &Consumer{tail: t, head: h, blocked: bl, data: d, mask: uint64(len(d) - 1), pos: h.Load()}
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
	off := p.pos & p.mask
	skip := uint64(0)
	if off+need > size {
		skip = size - off // a wrap marker fills the rest of the area
	}
	if p.pos+skip+need-p.headSeen > size {
		p.headSeen = p.head.Load()
		if p.pos+skip+need-p.headSeen > size {
			// Full: say so, then look again. A consumer that made room
			// meanwhile either is seen here or sees the mark (both are
			// sequentially consistent) and wakes this producer.
			if p.blocked.Load() == 0 { // a producer that retries writes it once
				p.blocked.Store(1)
			}
			p.headSeen = p.head.Load()
			if p.pos+skip+need-p.headSeen > size {
				return nil, nil
			}
		}
	}
	if skip > 0 {
		binary.LittleEndian.PutUint32(p.data[off:], wrapMarker)
		p.pos += skip
		off = 0
	}
	binary.LittleEndian.PutUint64(p.data[off:], uint64(n))
	p.res = n
	return p.data[off+frameHdr : off+frameHdr+uint64(n) : off+frameHdr+uint64(n)], nil
}

// Commit publishes the frame Reserve returned: the consumer may read it
// from now on.
func (p *Producer) Commit() {
	if p.res < 0 {
		panic("shm: Commit without Reserve")
	}
	p.pos += uint64(frameHdr + align8(p.res))
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
		tail := c.tail.Load()
		if tail == c.pos {
			return nil, nil
		}
		if tail-c.pos > size || tail < c.pos {
			return nil, c.corrupt("tail %d, head %d", tail, c.pos)
		}
		off := c.pos & c.mask
		if size-off < frameHdr {
			return nil, c.corrupt("frame header at %d crosses the end", off)
		}
		n := binary.LittleEndian.Uint32(c.data[off:])
		if n == wrapMarker {
			// The rest of the area is skipped.
			c.pos += size - off
			continue
		}
		need := uint64(frameHdr + align8(int(n)))
		if int(n) > len(c.data)/4-frameHdr || off+need > size || c.pos+need > tail {
			return nil, c.corrupt("frame of %d bytes at %d, tail %d", n, off, tail)
		}
		c.cur = need
		return c.data[off+frameHdr : off+frameHdr+uint64(n) : off+frameHdr+uint64(n)], nil
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
// must not keep its owner awake.
func (c *Consumer) Pending() bool { return c.err == nil && c.tail.Load() != c.pos }

func (c *Consumer) corrupt(format string, args ...any) error {
	c.err = fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
	return c.err
}
