//go:build linux

package softhca

import (
	"slices"

	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/qpstate"
	"github.com/xrcrun/xrc/softhca/roce"
)

// readBudget is how many READ response packets a QP sends in one round of
// the engine: a large READ streams over many rounds instead of being built
// all at once.
const readBudget = 64

// resource is a READ or atomic request the responder executed.
type resource struct {
	valid  bool
	atomic bool
	psn    uint32
	npkts  uint32
	rkey   uint32
	va     uint64
	length uint32
	pd     *pd    // READ: the PD the key must belong to
	orig   uint64 // atomic: the value returned
	next   uint32 // READ: the next response packet to send
	queued bool   // READ: in the QP's queue of responses to send
	// All of its responses were sent, once at least: until then the
	// requester cannot be done with it, and its entry is not free.
	answered bool
}

// responder is the receive side of a QP. Its first 48 bytes are what a
// message reads and writes (with the QP's receive CQ and SRQ before them,
// a cache line), then the scatter list of a receive (SENDs use it).
type responder struct {
	epsn    uint32 // expected PSN
	msn     uint32 // completed messages
	recvIdx uint32 // the receive WQE taken, for SENDs and writes with immediate
	off     uint32 // bytes received of the message in progress
	wlen    uint32 // RDMA WRITE: target region, address and length
	recvLen uint32
	wm      *mr
	wva     uint64
	nakSent bool // a NAK is outstanding: drop later packets silently
	ackDue  bool
	inMsg   bool // a message is in progress
	isSend  bool
	hasRecv bool
	queued  bool // in the engine's list of QPs with responses to send
	// A NAK that came due while READ responses of earlier requests were
	// still to be sent: it goes after them (nak).
	nakAfterReads bool
	nakSyndrome   uint8

	recvSG  []lsge // in recvSG1 while it has one entry
	recvSG1 [1]lsge
	// An XRC receive QP's SRQ for the message in progress, named by the
	// XRCETH of its packets.
	xsrq *srq

	// The READ and atomic requests executed, remembered for answering
	// duplicates: a ring of max_dest_rd_atomic entries (at least one), made
	// when the first such request comes, since most QPs never see one.
	res     []resource
	reads   []*resource // READs whose responses are being sent, in order
	readBuf []*resource // the array reads lives in
	resNext int32       // the ring's oldest entry, the next to reuse
	nakPSN  uint32
	// An acknowledgement due while READ responses of earlier requests
	// were still to be sent: it goes after them too.
	ackAfterReads bool
	nakFatal      bool // the NAK waiting for READ responses put the QP in error
	nakDropped    bool // requests were dropped since the NAK (nakSent)
}

// reset forgets everything but the buffers, and whether the QP is in the
// engine's READ queue: it stays there until the engine finds it has
// nothing to send, and a READ that comes before must not list it twice.
func (s *responder) reset() {
	clear(s.reads)
	clear(s.res)
	*s = responder{recvSG: s.recvSG[:0], reads: s.readBuf[:0], readBuf: s.readBuf, res: s.res, queued: s.queued}
}

func (s *responder) start(q *qp) { s.epsn = q.rqPSN }

// receive dispatches a packet delivered to the device. It owns p and
// returns it to the engine's packet cache. Caller holds d.mu and is the
// engine goroutine.
func (d *Device) receive(p *roce.Packet) {
	defer d.eng.pkts.put(p)
	if r := &d.eng.run; r.q != nil && !r.continues(p) {
		d.endRun()
	}
	if !d.portUp.Load() {
		return // lost on a port that is down
	}
	d.counters.RcvPackets.Add(1)
	d.counters.RcvData.Add(d.wireWords(p))
	op := p.Opcode
	q := d.qps.get(p.DestQP)
	// The port's one P_Key is the default partition's, 0xffff, a full
	// member: a packet matches it with either membership (IBA 10.9.3).
	if !op.Valid() || q == nil || op.Transport() != q.xport || q.dgid != p.SrcGID || p.PKey&0x7fff != 0x7fff ||
		q.typ == qpstate.XRCIni && !op.IsResponse() || q.typ == qpstate.XRCTgt && op.IsResponse() {
		d.counters.RcvErrors.Add(1)
		if d.debug {
			d.log.Debug("dropped packet", "opcode", op, "qp", p.DestQP)
		}
		return
	}
	if op.IsResponse() {
		d.onResponse(q, p)
		return
	}
	d.onRequest(q, p)
}

func (d *Device) onRequest(q *qp, p *roce.Packet) {
	s := &q.resp
	switch q.state {
	case qpstate.RTR, qpstate.RTS, qpstate.SQD, qpstate.SQE:
	default:
		d.counters.RcvErrors.Add(1)
		return
	}
	if dd := roce.PSNDiff(p.PSN, s.epsn); dd != 0 {
		if dd > 0 {
			d.counters.OutOfSequence.Add(1)
			if !s.nakSent {
				s.nakSent = true
				d.nak(q, roce.AETHNak|roce.NakPSNSeqErr, s.epsn)
			}
			s.nakDropped = true // this packet is dropped
			return
		}
		d.counters.DuplicateRequest.Add(1)
		d.duplicate(q, p)
		return
	}
	// The packet a NAK asked for came. If the NAK still waits behind READ
	// responses, it is answered: sent later it would send the requester
	// back for requests done already. But when packets after this one
	// were dropped meanwhile (they came before it: it was late, not sent
	// again), the requester must still go back for them: NAK again, after
	// this packet. (A fatal NAK put the QP in the error state, which takes
	// no requests.)
	renak := s.nakSent && s.nakAfterReads && s.nakDropped
	if s.nakSent {
		s.nakSent, s.nakAfterReads, s.nakDropped = false, false, false
	}
	if q.xrcd != nil && !d.bindXRCSRQ(q, p) {
		return
	}
	switch op := p.Opcode; {
	case (op.IsRead() || op.IsAtomic()) && q.maxDestRdAtomic == 0:
		d.fatal(q, p, roce.NakInvalidRequest) // no responder resources
	case op.HasIETH():
		// SEND with Invalidate: the device has no memory windows or
		// fast-registered keys to invalidate, and does not claim the
		// extensions (device_cap_flags): an operation it does not do.
		d.fatal(q, p, roce.NakInvalidRequest)
	case op.IsSend():
		d.recvSend(q, p)
	case op.IsWrite():
		d.recvWrite(q, p)
	case op.IsRead():
		d.recvRead(q, p)
	case op.IsAtomic():
		d.recvAtomic(q, p)
	}
	if renak && !s.nakSent && q.state != qpstate.Err {
		s.nakSent, s.nakDropped = true, false
		d.nak(q, roce.AETHNak|roce.NakPSNSeqErr, s.epsn)
	}
}

// fatal ends the QP's life as a responder: the requester gets a NAK with
// code, and the QP moves to the error state. Responses go in the order of
// the requests: if READ responses of earlier requests are still to be
// sent, the NAK follows them (a NAK overtaking them would tell the
// requester that they were lost).
//
// Its owners learn of it by an affiliated event, as mlx4 reports a
// responder's errors (the only way for the openers of an XRC receive QP,
// which has no CQ): QP_REQ_ERR for an invalid request, QP_ACCESS_ERR for
// an access error, QP_FATAL for the rest.
func (d *Device) fatal(q *qp, p *roce.Packet, code uint8) {
	// The NAK acknowledges the PSNs before p's: the WRITEs among them
	// land, though their bytes still wait in a run (a WRITE without
	// immediate data leaves its run open). The error state would drop it.
	// If they cannot be written, the NAK is for the run's first packet.
	psn := p.PSN
	if r := &d.eng.run; r.q == q && r.w == nil && !r.send {
		first := r.psn
		if !d.flushRun() {
			psn, code = first, roce.NakRemoteOpErr
		}
	}
	d.nak(q, roce.AETHNak|code, psn)
	q.resp.nakFatal = q.resp.nakAfterReads
	d.setState(q, qpstate.Err)
	var ev uint32 = evQPFatal
	switch code {
	case roce.NakInvalidRequest:
		ev = evQPReqErr
	case roce.NakRemoteAccess:
		ev = evQPAccessErr
	}
	d.qpEvent(q, ev)
}

// nak sends a NAK or an RNR NAK for psn, after the READ responses of
// earlier requests that are still to be sent: a NAK overtaking them would
// tell the requester that they were lost. A responder NAKs one packet at a
// time (it drops what follows until the requester goes back), so at most
// one waits; a fatal one replaces it.
func (d *Device) nak(q *qp, syndrome uint8, psn uint32) {
	s := &q.resp
	if len(s.reads) > 0 {
		s.nakAfterReads, s.nakSyndrome, s.nakPSN = true, syndrome, psn
		return
	}
	d.sendNak(q, syndrome, psn)
}

// payloadOK checks a packet's payload length against its place in the
// message: middle and first packets carry exactly one MTU, last ones 1 to
// an MTU, only ones up to an MTU.
func payloadOK(q *qp, p *roce.Packet) bool {
	n := uint32(len(p.Payload))
	switch {
	case !p.Opcode.IsLast():
		return n == q.mtu()
	case !p.Opcode.IsFirst():
		return n > 0 && n <= q.mtu()
	}
	return n <= q.mtu()
}

func (d *Device) recvSend(q *qp, p *roce.Packet) {
	s := &q.resp
	op := p.Opcode
	if op.IsFirst() {
		if s.inMsg {
			d.fatal(q, p, roce.NakInvalidRequest)
			return
		}
		if !d.takeRecv(q, p) {
			return
		}
		s.inMsg, s.isSend, s.off = true, true, 0
	} else if !s.inMsg || !s.isSend {
		d.fatal(q, p, roce.NakInvalidRequest)
		return
	}
	if !payloadOK(q, p) {
		d.fatal(q, p, roce.NakInvalidRequest)
		return
	}
	if s.off+uint32(len(p.Payload)) > s.recvLen {
		d.recvError(q, mlx4hw.SyndromeLocalLengthErr)
		d.fatal(q, p, roce.NakInvalidRequest)
		return
	}
	if !d.placeSend(q, p, s.recvSG, s.off) {
		d.recvError(q, mlx4hw.SyndromeLocalProtErr)
		d.fatal(q, p, roce.NakRemoteOpErr)
		return
	}
	if q.state == qpstate.Err {
		return // an earlier packet's bytes could not be written
	}
	s.off += uint32(len(p.Payload))
	d.accept(q, p)
	if op.IsLast() {
		if !d.runWritten(q) { // the completion says the bytes are in memory
			return
		}
		e := mlx4hw.CQE{Opcode: mlx4hw.RecvOpSend, ByteCnt: s.off}
		if op.HasImm() {
			e.Opcode, e.Immed = mlx4hw.RecvOpSendImm, p.Imm
		}
		d.completeRecv(q, &e, p.SE)
	}
}

func (d *Device) recvWrite(q *qp, p *roce.Packet) {
	s := &q.resp
	op := p.Opcode
	if op.IsFirst() {
		m, ok := d.startRemote(q, p, uint64(p.DMALen), accRemoteWrite)
		if !ok {
			return
		}
		if op.HasImm() && !d.takeRecv(q, p) {
			return // RNR: nothing started, the retry starts again
		}
		s.inMsg, s.isSend, s.off = true, false, 0
		s.wm, s.wva, s.wlen = m, p.VA, p.DMALen
	} else if !s.inMsg || s.isSend {
		d.fatal(q, p, roce.NakInvalidRequest)
		return
	}
	n := uint32(len(p.Payload))
	if !payloadOK(q, p) || s.off+n > s.wlen || op.IsLast() && s.off+n != s.wlen {
		d.fatal(q, p, roce.NakInvalidRequest)
		return
	}
	if op.HasImm() && !s.hasRecv {
		// The bytes before this packet go to memory first: if they
		// cannot, the NAK is theirs, not an RNR NAK of this packet,
		// which would acknowledge them.
		if !d.runWritten(q) {
			return
		}
		if !d.takeRecv(q, p) {
			return // RNR: the data comes again with the retry
		}
	}
	if n > 0 && !d.placeWrite(q, p, s.wm, s.wva+uint64(s.off)) {
		d.fatal(q, p, roce.NakRemoteOpErr)
		return
	}
	if q.state == qpstate.Err {
		return // an earlier packet's bytes could not be written
	}
	s.off += n
	d.accept(q, p)
	if op.IsLast() {
		if op.HasImm() {
			if !d.runWritten(q) { // the completion says the bytes are in memory
				return
			}
			e := mlx4hw.CQE{Opcode: mlx4hw.RecvOpRDMAWriteImm, ByteCnt: s.wlen, Immed: p.Imm}
			d.completeRecv(q, &e, p.SE)
		} else {
			s.inMsg = false
			s.wm = nil
		}
	}
}

// accept advances the expected PSN past a request packet and notes that
// an acknowledgement is due.
func (d *Device) accept(q *qp, p *roce.Packet) {
	s := &q.resp
	s.epsn = (s.epsn + 1) & roce.PSNMask
	if p.Opcode.IsLast() {
		s.msn = (s.msn + 1) & roce.PSNMask
	}
	if (p.Opcode.IsLast() || p.AckReq) && !s.ackDue {
		s.ackDue = true
		d.eng.acks = append(d.eng.acks, q)
	}
}

// startRemote checks the first packet of an RDMA or atomic request: no
// message may be in progress, and the access must pass remoteMR. On failure
// the QP has failed with the matching NAK.
func (d *Device) startRemote(q *qp, p *roce.Packet, n uint64, need uint32) (*mr, bool) {
	if q.resp.inMsg {
		d.fatal(q, p, roce.NakInvalidRequest)
		return nil, false
	}
	m, ok := d.remoteMR(q, q.respPD(), p.RKey, p.VA, n, need)
	if !ok {
		d.fatal(q, p, roce.NakRemoteAccess)
	}
	return m, ok
}

// remoteMR validates an incoming RDMA or atomic access against the QP's and
// the region's permissions, the PD (the QP's, or for an XRC receive QP the
// PD of the SRQ the request names) and the bounds. A zero-length access
// needs no region.
func (d *Device) remoteMR(q *qp, pd *pd, rkey uint32, va, n uint64, need uint32) (*mr, bool) {
	if q.access&need == 0 {
		return nil, false
	}
	if n == 0 {
		return nil, true
	}
	m := d.lookupMR(rkey)
	if m == nil || pd == nil || m.pd != pd || m.access&need == 0 || !m.contains(va, n) {
		return nil, false
	}
	return m, true
}

// takeRecv takes a receive WQE for the message p starts (or, for RDMA
// WRITE with immediate, ends), from the SRQ or the receive queue. Without
// one it sends an RNR NAK and reports false. A WQE whose buffers fail the
// checks completes in error and the QP fails.
func (d *Device) takeRecv(q *qp, p *roce.Packet) bool {
	s := &q.resp
	sg := d.eng.sgScratch[:0]
	var ok bool
	pd := q.pd
	srq := q.srq
	if q.xrcd != nil {
		srq = s.xsrq
	}
	if srq != nil {
		s.recvIdx, sg, ok = d.srqTake(srq, sg)
		pd = srq.pd
	} else if uint16(mlx4hw.LoadBE32(q.rqDB))-uint16(q.rqTook) != 0 {
		s.recvIdx = q.rqTook & (q.rq.cnt - 1)
		sg = mlx4hw.DecodeRecvSG(q.rq.slot(q.rqTook), q.rqGS, sg)
		q.rqTook++
		ok = true
	}
	if !ok {
		d.counters.RNRNaksSent.Add(1)
		s.nakSent, s.nakDropped = true, false
		d.nak(q, roce.AETHRNRNak|q.minRNRTimer&0x1f, p.PSN)
		return false
	}
	s.hasRecv = true
	d.eng.sgScratch = sg[:0] // keeps what the decoding grew
	if cap(s.recvSG) == 0 {
		s.recvSG = s.recvSG1[:0]
	}
	s.recvSG, s.recvLen = s.recvSG[:0], 0
	for _, g := range sg {
		if g.ByteCount == 0 {
			continue
		}
		m := d.lookupMR(g.LKey)
		if m == nil || m.pd != pd || m.access&accLocalWrite == 0 || !m.contains(g.Addr, uint64(g.ByteCount)) {
			d.recvError(q, mlx4hw.SyndromeLocalProtErr)
			d.fatal(q, p, roce.NakRemoteOpErr)
			return false
		}
		s.recvSG = append(s.recvSG, lsge{m: m, va: g.Addr, n: g.ByteCount})
		s.recvLen += g.ByteCount
	}
	return true
}

// completeRecv writes the receive completion of the message that ends.
func (d *Device) completeRecv(q *qp, e *mlx4hw.CQE, solicited bool) {
	s := &q.resp
	rcq, rqpn := q.recvCQ()
	e.MyQPN = q.num
	e.GMLPath = 1<<31 | rqpn // RoCE packets always carry a GRH
	e.WQEIndex = uint16(s.recvIdx)
	d.push(rcq, e, solicited)
	s.inMsg, s.hasRecv, s.wm = false, false, nil
	d.lostCompletion(q, rcq)
}

// lostCompletion fails an XRC receive QP, at the end of the round, if
// the CQ it completed into is overrun (failCQUsers).
func (d *Device) lostCompletion(q *qp, c *cq) {
	if q.xrcd != nil && c.errored {
		d.eng.cqLost = append(d.eng.cqLost, q)
	}
}

// recvError completes the receive WQE in progress with an error.
func (d *Device) recvError(q *qp, syndrome uint8) {
	s := &q.resp
	if !s.hasRecv {
		return
	}
	d.dropRun(q)
	d.counters.LocalErrors.Add(1)
	rcq, rqpn := q.recvCQ()
	e := mlx4hw.CQE{MyQPN: q.num, GMLPath: rqpn, WQEIndex: uint16(s.recvIdx), Opcode: mlx4hw.CQEOpError, Syndrome: syndrome}
	d.push(rcq, &e, true)
	s.hasRecv, s.inMsg = false, false
	d.lostCompletion(q, rcq)
}

func (d *Device) recvRead(q *qp, p *roce.Packet) {
	s := &q.resp
	mtu := q.mtu()
	npkts := max(1, (p.DMALen+mtu-1)/mtu)
	if p.DMALen > 1<<31 || npkts > roce.MaxMessagePackets {
		d.fatal(q, p, roce.NakInvalidRequest)
		return
	}
	if _, ok := d.startRemote(q, p, uint64(p.DMALen), accRemoteRead); !ok {
		return
	}
	r := d.remember(q)
	if r == nil {
		d.fatal(q, p, roce.NakInvalidRequest)
		return
	}
	*r = resource{valid: true, psn: p.PSN, npkts: npkts, rkey: p.RKey, va: p.VA, length: p.DMALen, pd: q.respPD()}
	s.epsn = (s.epsn + r.npkts) & roce.PSNMask
	s.msn = (s.msn + 1) & roce.PSNMask
	d.queueRead(q, r, p.PSN)
}

func (d *Device) recvAtomic(q *qp, p *roce.Packet) {
	s := &q.resp
	m, ok := d.startRemote(q, p, 8, accRemoteAtomic)
	if !ok {
		return
	}
	if p.VA%8 != 0 {
		d.fatal(q, p, roce.NakInvalidRequest)
		return
	}
	r := d.remember(q)
	if r == nil {
		d.fatal(q, p, roce.NakInvalidRequest)
		return
	}
	orig, ok := m.atomic(p.VA, p.Opcode.Op(), p.SwapAdd, p.Compare)
	if !ok {
		*r = resource{}
		d.fatal(q, p, roce.NakRemoteOpErr)
		return
	}
	*r = resource{valid: true, atomic: true, psn: p.PSN, npkts: 1, orig: orig}
	s.epsn = (s.epsn + 1) & roce.PSNMask
	s.msn = (s.msn + 1) & roce.PSNMask
	d.answerAtomic(q, r)
}

// answerAtomic sends an atomic's response, or queues it behind the READ
// responses still to be sent: responses go in the order of the requests.
func (d *Device) answerAtomic(q *qp, r *resource) {
	if len(q.resp.reads) > 0 {
		d.queueRead(q, r, r.psn)
		return
	}
	d.sendAtomicAck(q, r)
}

// remember returns the next slot for a READ or atomic resource, or nil if
// it holds one whose responses have not all been sent yet: the requester
// cannot be done with that one, so the new request is one more than
// max_dest_rd_atomic allows: the IBTA lists "too many RDMA READ or ATOMIC
// requests" among the causes of a NAK Invalid Request (rxe only NAKs those
// with max_dest_rd_atomic 0, and otherwise reuses the entry). A READ
// answered again in that slot (for its duplicate) stops.
func (d *Device) remember(q *qp) *resource {
	s := &q.resp
	if want := max(int(q.maxDestRdAtomic), 1); len(s.res) < want {
		s.growResources(want)
	}
	r := &s.res[s.resNext]
	if r.valid && !r.answered {
		return nil
	}
	s.resNext = (s.resNext + 1) % int32(len(s.res))
	if r.queued {
		s.reads = slices.DeleteFunc(s.reads, func(x *resource) bool { return x == r })
	}
	return r
}

// growResources makes the ring of resources n entries long (the first READ
// or atomic, or max_dest_rd_atomic raised since). The entries keep their
// order, oldest first, and the READs queued follow theirs.
func (s *responder) growResources(n int) {
	old := s.res
	res := make([]resource, n)
	for i := range old {
		j := (int(s.resNext) + i) % len(old)
		res[i] = old[j]
		for k, r := range s.reads {
			if r == &old[j] {
				s.reads[k] = &res[i]
			}
		}
	}
	s.res, s.resNext = res, int32(len(old))
}

// queueRead schedules the responses of a READ from PSN from.
func (d *Device) queueRead(q *qp, r *resource, from uint32) {
	s := &q.resp
	r.next = uint32(roce.PSNDiff(from, r.psn))
	if !r.queued {
		r.queued = true
		if len(s.reads) == 0 {
			s.reads = s.readBuf[:0]
		}
		s.reads = append(s.reads, r)
		if cap(s.reads) > cap(s.readBuf) {
			s.readBuf = s.reads[:0]
		}
	}
	if !s.queued {
		s.queued = true
		d.eng.readq = append(d.eng.readq, q)
	}
}

// sendReads sends up to readBudget READ response packets of a QP, oldest
// READ first. It reports whether responses remain.
//
// The packets of one READ a call sends are read from memory at once
// (mr.readv): through another process's memory, one system call for the
// run instead of one a packet.
func (d *Device) sendReads(q *qp) bool {
	s := &q.resp
	if q.state == qpstate.Err && !s.nakFatal {
		// Moved to the error state from outside (a command, the
		// requester's failure): the QP answers nothing any more. Only
		// a QP whose responder failed sends what came before its NAK.
		s.dropReads()
		return false
	}
	mtu := q.mtu()
	for budget := uint32(readBudget); budget > 0 && len(s.reads) > 0; {
		r := s.reads[0]
		if r.atomic { // an atomic that came after READs: its response follows theirs
			d.sendAtomicAck(q, r)
			r.queued = false
			s.reads[0] = nil
			s.reads = s.reads[1:]
			budget--
			continue
		}
		cnt := min(budget, r.npkts-r.next)
		if cnt == 0 { // cannot happen: a READ leaves the queue with its last packet
			r.queued = false
			s.reads[0] = nil
			s.reads = s.reads[1:]
			continue
		}
		ps, bufs := d.eng.runPkts[:0], d.eng.runBufs[:0]
		for k := r.next; k < r.next+cnt; k++ {
			p := d.newPacket(q)
			p.PSN = (r.psn + k) & roce.PSNMask
			first, last := k == 0, k == r.npkts-1
			switch {
			case first && last:
				p.Opcode = roce.ReadResponseOnly
			case first:
				p.Opcode = roce.ReadResponseFirst
			case last:
				p.Opcode = roce.ReadResponseLast
			default:
				p.Opcode = roce.ReadResponseMiddle
			}
			p.Opcode |= q.xport
			if first || last {
				p.Syndrome, p.MSN = roce.AETHAck|roce.AETHInvalidCredits, s.msn
			}
			off := k * mtu
			n := min(mtu, r.length-min(off, r.length))
			p.Payload = p.Payload[:n]
			if n > 0 {
				bufs = append(bufs, p.Payload)
			}
			ps = append(ps, p)
		}
		ok := true
		if len(bufs) > 0 {
			// Check the key again: the region may be gone since the
			// request came (or since the duplicate asking for it again).
			var m *mr
			m, ok = d.remoteMR(q, r.pd, r.rkey, r.va, uint64(r.length), accRemoteRead)
			// Copied, never lent (mr.lend): the memory a READ reads
			// may change meanwhile, and a payload must not change
			// between its ICRC and its copy into the socket buffer.
			ok = ok && m.readv(r.va+uint64(r.next*mtu), bufs)
		}
		psn := ps[0].PSN
		d.eng.endPacketRun(ps, bufs, ok)
		if !ok {
			// The NAK is for this READ: the later ones, and what was
			// to follow them, are dropped.
			s.dropReads()
			d.fatal(q, &roce.Packet{PSN: psn}, roce.NakRemoteAccess)
			return false
		}
		r.next += cnt
		budget -= cnt
		if r.next == r.npkts {
			r.queued, r.answered = false, true
			s.reads[0] = nil
			s.reads = s.reads[1:]
		}
	}
	if len(s.reads) > 0 {
		return true
	}
	// What waited for the responses, in PSN order: the acknowledgement
	// (unless the round's acknowledgements, which come later, send it
	// anyway), then a NAK of a later packet.
	if s.ackAfterReads {
		s.ackAfterReads = false
		if !s.ackDue {
			d.ackNow(q)
		}
	}
	if s.nakAfterReads {
		s.nakAfterReads = false
		d.sendNak(q, s.nakSyndrome, s.nakPSN)
	}
	return false
}

// dropReads forgets the READ and atomic responses still to be sent, and
// the acknowledgement and NAK that waited for them.
func (s *responder) dropReads() {
	for _, r := range s.reads {
		r.queued = false
	}
	clear(s.reads)
	s.reads, s.nakAfterReads, s.ackAfterReads = s.readBuf[:0], false, false
}

func (d *Device) sendAtomicAck(q *qp, r *resource) {
	r.answered = true
	p := d.newPacket(q)
	p.Opcode = roce.AtomicAcknowledge
	p.PSN = r.psn
	p.Syndrome, p.MSN = roce.AETHAck|roce.AETHInvalidCredits, q.resp.msn
	p.OrigData = r.orig
	p.Opcode |= q.xport
	d.eng.send(p)
}

// duplicate answers a request the responder has already executed: READs
// and atomics are answered again from what was remembered, SENDs and
// WRITEs are acknowledged again.
func (d *Device) duplicate(q *qp, p *roce.Packet) {
	s := &q.resp
	op := p.Opcode
	if op.IsRead() || op.IsAtomic() {
		for i := range s.res {
			r := &s.res[i]
			if !r.valid || r.atomic != op.IsAtomic() {
				continue
			}
			if dd := roce.PSNDiff(p.PSN, r.psn); dd >= 0 && uint32(dd) < r.npkts {
				if r.atomic {
					d.answerAtomic(q, r)
				} else {
					d.queueRead(q, r, p.PSN)
				}
				return
			}
		}
		return // too old to answer
	}
	// Every duplicate SEND or WRITE packet is acknowledged again at once
	// (C9-105; rxe does the same), not once per round: after a timeout
	// the requester sends its window again, and an acknowledgement per
	// packet gives it that many chances to get through a lossy link. One
	// per round made a requester under 10% loss give up now and then,
	// seven lost acknowledgements in a row being likely enough over the
	// tens of thousands of timeouts of a long run.
	d.sendAck(q)
}

// sendAck acknowledges everything up to the expected PSN. Responses go in
// the order of the requests: while READ responses of earlier requests are
// still to be sent (the QP is queued for them), the acknowledgement waits
// for them (sendReads sends it), or the requester would take them for lost
// (an implied NAK) and ask for them again.
func (d *Device) sendAck(q *qp) {
	if q.resp.queued {
		q.resp.ackAfterReads = true
		return
	}
	d.ackNow(q)
}

// ackNow sends the acknowledgement of everything up to the expected PSN.
func (d *Device) ackNow(q *qp) {
	if q.state == qpstate.Err || q.state == qpstate.Reset {
		return
	}
	d.sendNak(q, roce.AETHAck|roce.AETHInvalidCredits, (q.resp.epsn-1)&roce.PSNMask)
}

// sendNak sends an Acknowledge packet with the given syndrome (an ACK, an
// RNR NAK or a NAK) for psn.
func (d *Device) sendNak(q *qp, syndrome uint8, psn uint32) {
	if d.debug {
		d.log.Debug("send ack/nak", "qp", q.num, "syndrome", syndrome, "psn", psn, "epsn", q.resp.epsn)
	}
	if syndrome&roce.AETHKind != roce.AETHAck {
		d.counters.NaksSent.Add(1)
	}
	p := d.newPacket(q)
	p.Opcode = roce.Acknowledge
	p.PSN = psn
	p.Syndrome, p.MSN = syndrome, q.resp.msn
	p.Opcode |= q.xport
	d.eng.send(p)
}

// flush completes every outstanding work request of a QP that entered the
// error state with WR_FLUSH_ERR: the send WQEs the requester holds or that
// are posted, and the posted receive WQEs. A QP on an SRQ leaves the SRQ's
// WQEs alone and reports its last WQE reached instead.
func (d *Device) flush(q *qp) {
	r := &q.req
	for _, w := range r.q {
		d.flushCQE(q.scq, q.num, w.idx, true)
		d.eng.wqes.put(w)
	}
	clear(r.q)
	r.q, r.sendIdx, r.rdAtomic = r.qbuf[:0], 0, 0
	d.eng.cancelTimer(q)
	d.flushPosted(q)
	d.dropRun(q)
	s := &q.resp
	if s.hasRecv {
		rcq, rqpn := q.recvCQ()
		e := mlx4hw.CQE{MyQPN: q.num, GMLPath: rqpn, WQEIndex: uint16(s.recvIdx), Opcode: mlx4hw.CQEOpError,
			Syndrome: mlx4hw.SyndromeWRFlushErr}
		d.push(rcq, &e, true)
		s.hasRecv, s.inMsg = false, false
	}
	if q.srq != nil {
		d.qpEvent(q, evQPLastWQEReached)
	}
}

// flushPosted flushes the WQEs posted to a QP in the error state since the
// last look: send WQEs when the client rings the send doorbell, receive
// WQEs (which have no doorbell) at each round of the engine.
func (d *Device) flushPosted(q *qp) {
	r := &q.req
	for sqOwned(q, r.head) {
		d.flushCQE(q.scq, q.num, r.head, true)
		r.head++
	}
	d.flushPostedRecv(q)
}

func (d *Device) flushPostedRecv(q *qp) {
	if q.srq == nil && q.rqDB != nil {
		for uint16(mlx4hw.LoadBE32(q.rqDB))-uint16(q.rqTook) != 0 {
			d.flushCQE(q.rcq, q.num, q.rqTook&(q.rq.cnt-1), false)
			q.rqTook++
		}
	}
}

func (d *Device) flushCQE(c *cq, qpn, idx uint32, send bool) {
	e := mlx4hw.CQE{MyQPN: qpn, WQEIndex: uint16(idx), IsSend: send, Opcode: mlx4hw.CQEOpError,
		Syndrome: mlx4hw.SyndromeWRFlushErr}
	d.push(c, &e, true)
}
