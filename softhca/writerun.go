//go:build linux

package softhca

import (
	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/qpstate"
	"github.com/xrcrun/xrc/softhca/roce"
)

// writeRun holds the payloads of packets that go, one after another, to
// consecutive bytes of memory the device reaches through another process,
// so that they are written with one process_vm_writev instead of one each:
// the system call's fixed cost (finding the process, checking access,
// pinning the pages) is most of what placing a 4 KiB packet that way
// costs. The packets are a READ's responses (the requester's run, w set)
// or the request packets of an RDMA WRITE or a SEND (the responder's run,
// w nil). A run whose message fails is dropped, not written (dropRun).
//
// A run belongs to one READ (q, w), or one WRITE or SEND of q. It is
// written before anything that depends on its bytes: the READ's
// completion, the WRITE's or SEND's completion and its acknowledgement,
// any packet that does not continue it (Device.receive), and the end of
// the round's received packets, after which the buffers the
// payloads lie in (the link's receive buffer) are used again; the round's
// acknowledgements go after that. Only payloads outside their packet's own
// storage join a run: a packet's storage goes back to the engine's cache
// when the packet has been handled.
//
// The engine owns its run; it is touched with d.mu held.
type writeRun struct {
	mem  memory
	addr uint64   // where the run starts in the client's memory
	n    uint64   // bytes in the run
	bufs [][]byte // the payloads, in order
	q    *qp      // the QP, nil when there is no run
	w    *swqe    // the READ's WQE; nil for a WRITE's or a SEND's run
	send bool     // a SEND's run, into the receive's scatter list
	psn  uint32   // the PSN of the run's first packet (a WRITE's or SEND's NAK names it)
	next uint32   // the PSN of the packet that would continue it
}

// continues reports whether p is the next packet of the run's READ (a
// response) or WRITE (a request), which the run may take. It does not look
// at the source: a stray packet with the right QP number and PSN from
// elsewhere neither ends the run nor joins it, since receive then drops it
// (its source GID is not the QP's peer's). Any other packet ends the run,
// the peer's acknowledgements on the same QP included: correct, if slower.
func (r *writeRun) continues(p *roce.Packet) bool {
	if p.PSN != r.next || p.DestQP != r.q.num {
		return false
	}
	switch p.Opcode.Op() {
	case roce.ReadResponseMiddle, roce.ReadResponseLast:
		return r.w != nil
	case roce.WriteMiddle, roce.WriteLast, roce.WriteLastImm:
		return r.w == nil && !r.send
	case roce.SendMiddle, roce.SendLast, roce.SendLastImm:
		return r.w == nil && r.send
	}
	return false
}

// placeRead writes the payload of READ response p into w's scatter list at
// byte w.rdGot: into the run when it can, else at once, after writing the
// run. It reports false if memory could not be written.
func (d *Device) placeRead(q *qp, w *swqe, p *roce.Packet) bool {
	r := &d.eng.run
	mem, addr, join := sgTarget(w.sg, w.rdGot, p)
	if r.q != nil && !(join && r.extends(q, w, false, mem, addr)) {
		if r.w != w {
			d.endRun() // another's run: its failure is its own
		} else if !d.flushRun() {
			return false
		}
	}
	if !join {
		return scatter(w.sg, w.rdGot, p.Payload)
	}
	r.add(q, w, false, mem, addr, p)
	return true
}

// extends reports whether a payload of q's message (the READ w's
// responses or, w nil, q's SEND if send, else its WRITE) bound for addr of
// mem continues the run.
func (r *writeRun) extends(q *qp, w *swqe, send bool, mem memory, addr uint64) bool {
	return r.q == q && r.w == w && r.send == send && r.mem == mem && r.addr+r.n == addr
}

// add appends p's payload to the run, which starts with it if there is
// none: a run of q's, of the READ w's responses or (w nil) of q's SEND
// (send) or WRITE, to addr of mem.
func (r *writeRun) add(q *qp, w *swqe, send bool, mem memory, addr uint64, p *roce.Packet) {
	if r.q == nil {
		r.mem, r.addr, r.n, r.q, r.w, r.send, r.psn = mem, addr, 0, q, w, send, p.PSN
	}
	r.bufs = append(r.bufs, p.Payload)
	r.n += uint64(len(p.Payload))
	r.next = (p.PSN + 1) & roce.PSNMask
}

// placeWrite writes the payload of RDMA WRITE packet p at va of m: into
// the run when it can (memory the device reaches through another process,
// a payload outside its packet), else at once. It reports false if memory
// could not be written; after a run of q's that could not be written (an
// earlier packet's bytes), q is in the error state and has sent its NAK.
func (d *Device) placeWrite(q *qp, p *roce.Packet, m *mr, va uint64) bool {
	mem, addr, join := regionTarget(m, va, p)
	if !d.joinRun(q, p, join, false, mem, addr) {
		return m.write(va, p.Payload)
	}
	return true
}

// placeSend writes the payload of SEND packet p into the receive's scatter
// list sg at byte off: into the run when it can (a payload outside its
// packet that lies in one element's memory, which the device reaches
// through another process), else at once. It reports false if memory could
// not be written; after a run of q's that could not be written, q is in
// the error state and has sent its NAK.
func (d *Device) placeSend(q *qp, p *roce.Packet, sg []lsge, off uint32) bool {
	mem, addr, join := sgTarget(sg, off, p)
	if !d.joinRun(q, p, join, true, mem, addr) {
		return scatter(sg, off, p.Payload)
	}
	return true
}

// joinRun adds the payload of q's request packet p, bound for addr of mem,
// to the run if join, ending any run it does not continue first. It
// reports whether p is taken care of: joined, or answered by the NAK of a
// run of q's that could not be written (q is then in the error state);
// else the caller writes p at once.
func (d *Device) joinRun(q *qp, p *roce.Packet, join, send bool, mem memory, addr uint64) bool {
	r := &d.eng.run
	if r.q != nil && !(join && r.extends(q, nil, send, mem, addr)) {
		d.endRun()
		if q.state == qpstate.Err {
			return true // the run's NAK is out; this packet answers to it
		}
	}
	if !join {
		return false
	}
	r.add(q, nil, send, mem, addr, p)
	return true
}

// regionTarget reports whether p's payload, bound for va of region m, may
// join a run (the device reaches m through the client's process, and the
// payload lies outside its packet), and where in the client's memory it
// goes.
func regionTarget(m *mr, va uint64, p *roce.Packet) (memory, uint64, bool) {
	if m.view != nil || m.dead || inStorage(p) {
		return nil, 0, false
	}
	return m.client.mem, m.addr + (va - m.iova), true
}

// sgTarget is regionTarget for a payload bound for byte off of scatter
// list sg: it joins only if it lies in one element's memory.
func sgTarget(sg []lsge, off uint32, p *roce.Packet) (memory, uint64, bool) {
	e, eoff, ok := sgeAt(sg, off)
	if n := uint32(len(p.Payload)); !ok || n == 0 || eoff+n > e.n {
		return nil, 0, false
	}
	return regionTarget(e.m, e.va+uint64(eoff), p)
}

// flushRun writes the run, if there is one, and ends it. It reports
// whether the write succeeded; the caller fails the run's READ if not
// (endRun handles every kind of run).
func (d *Device) flushRun() bool {
	r := &d.eng.run
	if r.q == nil {
		return true
	}
	err := r.mem.writev(r.addr, r.bufs)
	r.reset()
	return err == nil
}

// dropRun ends a run of q's without writing it, when q's receive fails or
// q goes to the error state (a READ that fails does): the failed message's
// bytes need not land, and must not land after the completion that fails
// it, when the client may have taken its buffer back.
func (d *Device) dropRun(q *qp) {
	if r := &d.eng.run; r.q == q {
		r.reset()
	}
}

// runWritten writes the run before what depends on its bytes (endRun),
// and reports whether q still stands: false if a run of q's could not be
// written, which put q in the error state and NAKed.
func (d *Device) runWritten(q *qp) bool {
	d.endRun()
	return q.state != qpstate.Err
}

// reset ends the run without writing it.
func (r *writeRun) reset() {
	clear(r.bufs)
	r.bufs = r.bufs[:0]
	r.mem, r.q, r.w, r.send = nil, nil, nil, false
}

// endRun writes the run. If that failed it fails the run's READ, or NAKs
// the run's WRITE or SEND from its first packet, which puts the QP in the
// error state, and for a SEND fails its receive, as a packet that could
// not be written at once does.
func (d *Device) endRun() {
	r := &d.eng.run
	q, w, psn, send := r.q, r.w, r.psn, r.send
	if d.flushRun() {
		return
	}
	switch {
	case w != nil:
		d.requestError(q, w, mlx4hw.SyndromeLocalProtErr)
	case q.state != qpstate.Err: // else a packet of the run failed the QP, and NAKed
		if send {
			d.recvError(q, mlx4hw.SyndromeLocalProtErr)
		}
		d.fatal(q, &roce.Packet{PSN: psn}, roce.NakRemoteOpErr)
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
