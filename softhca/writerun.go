//go:build linux

package softhca

import (
	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/softhca/roce"
)

// writeRun holds the payloads of READ response packets that go, one after
// another, to consecutive bytes of memory the device reaches through
// another process, so that they are written with one process_vm_writev
// instead of one each: the system call's fixed cost (finding the process,
// checking access, pinning the pages) is most of what placing a 4 KiB
// packet that way costs.
//
// A run belongs to one READ (q, w). It is written before anything that
// depends on its bytes: the READ's completion, any packet that does not
// continue it (Device.receive), an error of the READ, and the end of the
// round's received packets, after which the buffers the payloads lie in
// (the link's receive buffer) are used again. Only payloads outside their
// packet's own storage join a run: a packet's storage goes back to the
// engine's cache when the packet has been handled.
//
// The engine owns its run; it is touched with d.mu held.
type writeRun struct {
	mem  memory
	addr uint64   // where the run starts in the client's memory
	n    uint64   // bytes in the run
	bufs [][]byte // the payloads, in order
	q    *qp      // the READ's QP and WQE, nil when there is no run
	w    *swqe
	next uint32 // the PSN of the response packet that would continue it
}

// continues reports whether p is the next response packet of the run's
// READ, which the run may take. It does not look at the source: a stray
// packet with the right QP number and PSN from elsewhere neither ends the
// run nor joins it, since receive then drops it (its source GID is not
// the QP's peer's).
func (r *writeRun) continues(p *roce.Packet) bool {
	op := p.Opcode.Op()
	return (op == roce.ReadResponseMiddle || op == roce.ReadResponseLast) &&
		p.PSN == r.next && p.DestQP == r.q.num
}

// placeRead writes the payload of READ response p into w's scatter list at
// byte w.rdGot: into the run when it can, else at once, after writing the
// run. It reports false if memory could not be written.
func (d *Device) placeRead(q *qp, w *swqe, p *roce.Packet) bool {
	r := &d.eng.run
	n := uint32(len(p.Payload))
	s, off, ok := sgeAt(w.sg, w.rdGot)
	// A payload joins the run if it lies in one element's memory, which
	// the device reaches through another process, outside its packet.
	join := ok && n > 0 && off+n <= s.n && s.m.view == nil && !s.m.dead && !inStorage(p)
	var mem memory
	var addr uint64
	if join {
		mem, addr = s.m.client.mem, s.m.addr+(s.va+uint64(off)-s.m.iova)
	}
	if r.q != nil && !(join && r.q == q && r.w == w && r.mem == mem && r.addr+r.n == addr) {
		if !d.flushRun() {
			return false
		}
	}
	if !join {
		return scatter(w.sg, w.rdGot, p.Payload)
	}
	if r.q == nil {
		r.mem, r.addr, r.n, r.q, r.w = mem, addr, 0, q, w
	}
	r.bufs = append(r.bufs, p.Payload)
	r.n += uint64(n)
	r.next = (p.PSN + 1) & roce.PSNMask
	return true
}

// flushRun writes the run, if there is one, and ends it. It reports
// whether the write succeeded; the caller fails the run's READ if not.
func (d *Device) flushRun() bool {
	r := &d.eng.run
	if r.q == nil {
		return true
	}
	err := r.mem.writev(r.addr, r.bufs)
	r.reset()
	return err == nil
}

// reset ends the run without writing it.
func (r *writeRun) reset() {
	clear(r.bufs)
	r.bufs = r.bufs[:0]
	r.mem, r.q, r.w = nil, nil, nil
}

// endRun writes the run and fails its READ if that failed.
func (d *Device) endRun() {
	if q, w := d.eng.run.q, d.eng.run.w; !d.flushRun() {
		d.requestError(q, w, mlx4hw.SyndromeLocalProtErr)
	}
}

// sgeAt finds the scatter/gather element that holds byte off of a list, and
// the offset into it.
func sgeAt(sg []lsge, off uint32) (lsge, uint32, bool) {
	for _, s := range sg {
		if off < s.n {
			return s, off, true
		}
		off -= s.n
	}
	return lsge{}, 0, false
}
