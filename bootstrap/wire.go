package bootstrap

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// A frame is a 5-byte header, the message type (1 byte) and the payload's
// length (4 bytes, big endian), then the payload. Integers in payloads are
// big endian; byte strings and strings are a 4-byte length then the bytes.
// The handshake's first two messages carry the magic and the protocol
// version; every later message is of this version.
const (
	magic        = "XRCB"
	protoVersion = 3 // 3: an abort can blame a rank
	headerLen    = 5
	nonceLen     = 32
	proofLen     = 32

	// MaxRecord is the largest record a rank may send: an endpoint, an
	// all-gather record or a value.
	MaxRecord = 64 << 20
	// MaxGather is the largest all-gather result (or member table) the
	// server sends; an all-gather whose records sum to more aborts the job.
	MaxGather = 1 << 30
	// MaxKey is the longest key of Put and Get.
	MaxKey = 4096

	maxPreAuth    = 256                     // largest frame before the peer has proven the key
	maxFromRank   = MaxRecord + MaxKey + 64 // largest frame a rank sends
	maxFromServer = MaxGather + 1<<20       // largest frame the server sends
)

type msgType uint8

const (
	tHello     msgType = iota + 1 // rank → server: magic, version, client nonce
	tChallenge                    // server → rank: magic, version, server nonce, server proof
	tAuth                         // rank → server: client proof
	tRegister                     // rank → server: rank, size, node, local rank, endpoint
	tReject                       // server → rank: why it refuses the rank (then it closes)
	tReady                        // server → rank: the member table, once every rank registered
	tGather                       // rank → server: a contribution to a collective
	tGathered                     // server → rank: a collective's result
	tPut                          // rank → server: request id, key, value
	tPutDone                      // server → rank: request id, error text (empty: stored)
	tGet                          // rank → server: request id, key
	tGot                          // server → rank: request id, value
	tAbort                        // either way: the job ends
	tLeave                        // rank → server: a clean leave; the connection closes next
	tCancel                       // rank → server: request id of a get it no longer waits for
	tLast
)

var typeNames = [...]string{"", "hello", "challenge", "auth", "register", "reject", "ready", "gather",
	"gathered", "put", "put-done", "get", "got", "abort", "leave", "cancel"}

func (t msgType) String() string {
	if t > 0 && t < tLast {
		return typeNames[t]
	}
	return fmt.Sprintf("type-%d", uint8(t))
}

// readFrame reads one frame whose payload is at most limit bytes. The
// payload is a new buffer owned by the caller. A clean end of the stream
// before a header is io.EOF; anything else wrong wraps ErrProtocol.
func readFrame(r *bufio.Reader, limit int) (msgType, []byte, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, nil, protoErr("truncated", "truncated frame header")
		}
		return 0, nil, err
	}
	t, n := msgType(h[0]), binary.BigEndian.Uint32(h[1:])
	if t == 0 || t >= tLast {
		return 0, nil, protoErr("unknown_type", "unknown message type %d", h[0])
	}
	if uint64(n) > uint64(limit) {
		return t, nil, protoErr("too_large", "%v message of %d bytes exceeds the limit of %d", t, n, limit)
	}
	var p []byte
	var err error
	if n <= 1<<20 {
		p = make([]byte, n)
		_, err = io.ReadFull(r, p)
	} else {
		// Grow with what arrives, so that a header alone cannot make the
		// reader allocate a large buffer.
		var b bytes.Buffer
		b.Grow(1 << 20)
		_, err = io.CopyN(&b, r, int64(n))
		p = b.Bytes()
	}
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return t, nil, protoErr("truncated", "%v message truncated", t)
		}
		return t, nil, err
	}
	return t, p, nil
}

// appendFrame appends m as a frame to dst.
func appendFrame(dst []byte, m message) []byte {
	start := len(dst)
	dst = append(dst, byte(m.typ()), 0, 0, 0, 0)
	e := encoder{b: dst}
	m.encode(&e)
	binary.BigEndian.PutUint32(e.b[start+1:], uint32(len(e.b)-start-headerLen))
	return e.b
}

type encoder struct{ b []byte }

func (e *encoder) u8(v uint8)   { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16) { e.b = binary.BigEndian.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.BigEndian.AppendUint64(e.b, v) }
func (e *encoder) raw(v []byte) { e.b = append(e.b, v...) }
func (e *encoder) bytes(v []byte) {
	e.u32(uint32(len(v)))
	e.b = append(e.b, v...)
}
func (e *encoder) str(v string) {
	e.u32(uint32(len(v)))
	e.b = append(e.b, v...)
}

// decoder reads a payload with a sticky error, as an iterator with Err.
// Byte strings it returns alias the payload.
type decoder struct {
	b   []byte
	t   msgType
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = protoErr("malformed", "%v message: %s", d.t, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.fail("%d bytes past its end", n-len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if v := d.take(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// bytes reads a byte string of at most max bytes.
func (d *decoder) bytes(max int) []byte {
	n := d.u32()
	if d.err == nil && uint64(n) > uint64(max) {
		d.fail("a field of %d bytes exceeds the limit of %d", n, max)
	}
	return d.take(int(n))
}

func (d *decoder) str(max int) string { return string(d.bytes(max)) }

// count reads a count of items each at least min bytes long, rejecting
// counts the rest of the payload cannot hold before anything is allocated.
func (d *decoder) count(min int) int {
	n := d.u32()
	if d.err == nil && uint64(n)*uint64(min) > uint64(len(d.b)) {
		d.fail("%d items cannot fit in %d bytes", n, len(d.b))
		return 0
	}
	return int(n)
}

// end checks that the payload was used up.
func (d *decoder) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d bytes left over", len(d.b))
	}
	return d.err
}
