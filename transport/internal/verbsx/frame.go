package verbsx

import (
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/verbs"
)

// NoSlot is the send slot of a frame sent inline.
const NoSlot = 1<<32 - 1

// Frame points wr at the frame made of parts (total bytes, at most the
// send buffers' size): inline, from the parts themselves, when total is
// at most inline and sges (scratch of the caller's) has room for them,
// with SendInline set; else copied into a free send slot. It returns the
// slot (NoSlot when inline), which belongs to the device once wr is
// posted, until its completion (SendPool.Put); ok is false when no slot
// is free. The parts are the caller's again when PostSend returns.
func (c *Core) Frame(wr *verbs.SendWR, sges []verbs.SGE, inline int, parts [][]byte, total int) (slot uint32, ok bool) {
	if total <= inline && len(parts) <= len(sges) {
		wr.Flags |= verbs.SendInline
		wr.SG = sges[:0]
		for _, b := range parts {
			if len(b) > 0 {
				wr.SG = append(wr.SG, verbs.SGE{Addr: uint64(unix.AddrOf(b)), Length: uint32(len(b))})
			}
		}
		return NoSlot, true
	}
	if slot, ok = c.Send.Get(); !ok {
		return 0, false
	}
	buf, off := c.Send.Buf(slot), 0
	for _, b := range parts {
		off += copy(buf[off:], b)
	}
	if total > 0 {
		sges[0] = c.Send.SGE(slot, total)
		wr.SG = sges[:1]
	}
	return slot, true
}
