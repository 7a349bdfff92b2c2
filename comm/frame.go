package comm

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/xrcrun/xrc/transport"
)

// A frame is what comm sends through a transport: a fixed header, then the
// payload of an eager message or the sender's Remote of a rendezvous.
//
//	0   kind (u8), 3 reserved bytes
//	4   communicator context id (u32)
//	8   source: the sender's rank in the communicator (i32)
//	12  tag (i32)
//	16  message length (u64)
//	24  the sender's request id (u64): rendezvous, finish, push and data frames
//	32  eager: the payload; rendezvous: the Remote (at most transport.MaxRemote bytes);
//	    data: a piece of the message, at the offset the length field holds
const hdrLen = 32

type frameKind uint8

const (
	kindEager frameKind = 1 + iota // the message is in the frame
	kindRTS                        // ready to send: pull the message from the Remote
	kindFIN                        // the receiver has pulled message id: the sender may reuse it
	kindPush                       // the receiver cannot pull message id: the sender pushes it in data frames
	kindData                       // a piece of message id, at offset length, pushed
)

type header struct {
	kind     frameKind
	ctx      uint32
	src, tag int32
	length   uint64
	id       uint64
}

// errFrame reports a frame that does not decode; the message names why.
var errFrame = errors.New("comm: malformed frame")

func (h *header) put(b []byte) {
	b[0] = byte(h.kind)
	b[1], b[2], b[3] = 0, 0, 0
	binary.LittleEndian.PutUint32(b[4:], h.ctx)
	binary.LittleEndian.PutUint32(b[8:], uint32(h.src))
	binary.LittleEndian.PutUint32(b[12:], uint32(h.tag))
	binary.LittleEndian.PutUint64(b[16:], h.length)
	binary.LittleEndian.PutUint64(b[24:], h.id)
}

// parseFrame decodes a frame's header and returns its body (aliasing f).
// It checks what the receiver relies on: the kind, a non-negative source
// and tag, an eager body of the stated length, a Remote of a possible size
// and an empty finish frame.
func parseFrame(f []byte) (header, []byte, error) {
	var h header
	if len(f) < hdrLen {
		return h, nil, fmt.Errorf("%w: %d bytes", errFrame, len(f))
	}
	h.kind = frameKind(f[0])
	h.ctx = binary.LittleEndian.Uint32(f[4:])
	h.src = int32(binary.LittleEndian.Uint32(f[8:]))
	h.tag = int32(binary.LittleEndian.Uint32(f[12:]))
	h.length = binary.LittleEndian.Uint64(f[16:])
	h.id = binary.LittleEndian.Uint64(f[24:])
	body := f[hdrLen:]
	if h.src < 0 || h.tag < 0 {
		return h, nil, fmt.Errorf("%w: source %d, tag %d", errFrame, h.src, h.tag)
	}
	switch h.kind {
	case kindEager:
		if uint64(len(body)) != h.length {
			return h, nil, fmt.Errorf("%w: eager body of %d bytes says %d", errFrame, len(body), h.length)
		}
	case kindRTS:
		if len(body) == 0 || len(body) > transport.MaxRemote {
			return h, nil, fmt.Errorf("%w: remote of %d bytes", errFrame, len(body))
		}
	case kindFIN, kindPush:
		if len(body) != 0 {
			return h, nil, fmt.Errorf("%w: frame of kind %d with a body", errFrame, h.kind)
		}
	case kindData:
		if len(body) == 0 || h.length > 1<<62 {
			return h, nil, fmt.Errorf("%w: data frame of %d bytes at %d", errFrame, len(body), h.length)
		}
	default:
		return h, nil, fmt.Errorf("%w: kind %d", errFrame, h.kind)
	}
	return h, body, nil
}
