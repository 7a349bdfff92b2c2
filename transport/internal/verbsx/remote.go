package verbsx

import (
	"encoding/binary"
	"fmt"

	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/transport"
)

// A Remote of a verbs transport (transport.Remote):
//
//	0   the transport's magic byte ('R' for rc, 'X' for xrc), 3 reserved bytes
//	4   the exposing rank (u32)
//	8   address (u64)
//	16  rkey (u32)
//	20  length (u64)
const remoteLen = 28

// Remote is a decoded transport.Remote.
type Remote struct {
	Rank int
	Addr uint64
	RKey uint32
	Len  uint64
}

// Encode makes the transport.Remote of r, marked with magic.
func (r Remote) Encode(magic byte) transport.Remote {
	b := make([]byte, remoteLen)
	b[0] = magic
	binary.LittleEndian.PutUint32(b[4:], uint32(r.Rank))
	binary.LittleEndian.PutUint64(b[8:], r.Addr)
	binary.LittleEndian.PutUint32(b[16:], r.RKey)
	binary.LittleEndian.PutUint64(b[20:], r.Len)
	return b
}

// ParseRemote decodes b, a Remote marked with magic.
func ParseRemote(b []byte, magic byte) (Remote, bool) {
	if len(b) != remoteLen || b[0] != magic || b[1]|b[2]|b[3] != 0 {
		return Remote{}, false
	}
	r := Remote{Rank: int(binary.LittleEndian.Uint32(b[4:])), Addr: binary.LittleEndian.Uint64(b[8:]),
		RKey: binary.LittleEndian.Uint32(b[16:]), Len: binary.LittleEndian.Uint64(b[20:])}
	if r.Addr+r.Len < r.Addr {
		return Remote{}, false
	}
	return r, true
}

// Expose registers buf for remote reads (through the registration
// cache) and describes it: this rank, its address, rkey and length, marked
// with the transport's magic. The caller keeps buf alive and unmoved until
// Unexpose.
func (e *Endpoint) Expose(buf []byte) (transport.Remote, error) {
	if e.stopped {
		return nil, e.errClosed("expose")
	}
	r := Remote{Rank: e.rank}
	if len(buf) > 0 {
		ent, err := e.Core.Cache.Get(buf)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.name, err)
		}
		r.Addr, r.RKey, r.Len = uint64(unix.AddrOf(buf)), ent.MR.RKey(), uint64(len(buf))
	}
	e.m.Exposed.Inc()
	return r.Encode(e.magic), nil
}

// Unexpose ends an Expose: the registration may be dropped (or kept in
// the cache). A Remote that this rank did not make, or that is not
// exposed, is ErrBadRemote.
func (e *Endpoint) Unexpose(rm transport.Remote) error {
	if e.stopped {
		return e.errClosed("unexpose")
	}
	r, ok := ParseRemote(rm, e.magic)
	if !ok || r.Rank != e.rank {
		return fmt.Errorf("%w: unexpose a remote this rank did not make", transport.ErrBadRemote)
	}
	if r.Len == 0 {
		return nil
	}
	ent := e.Core.Cache.Find(uintptr(r.Addr), int(r.Len), r.RKey)
	if ent == nil {
		return fmt.Errorf("%w: unexpose %d bytes at %#x: not exposed", transport.ErrBadRemote, r.Len, r.Addr)
	}
	return e.Core.Cache.Put(ent)
}
