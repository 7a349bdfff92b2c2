//go:build linux

package softhca

import (
	"encoding/binary"
	"time"

	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/qpstate"
	"github.com/xrcrun/xrc/softhca/roce"
)

// Requester limits.
const (
	maxOutstanding = 1024 // WQEs fetched and not completed, per QP
	sendWindow     = 512  // packets sent and not acknowledged, per QP, at most
	minWindow      = 8    // the window never shrinks below this
	ackEvery       = 64   // packets between acknowledgement requests
)

// Classes of send work requests.
const (
	classSend = iota
	classWrite
	classRead
	classAtomic
)

// lsge is a local scatter/gather element resolved to its memory region.
type lsge struct {
	m  *mr
	va uint64
	n  uint32
}

// swqe is a send WQE the requester has fetched: its decoded form, the
// memory it names, and where it stands on the wire.
type swqe struct {
	idx    uint32 // SQ index
	w      mlx4hw.SendWQE
	class  int
	sg     []lsge
	length uint32
	psn    uint32 // first PSN
	npkts  uint32
	sent   uint32 // packets sent in the current attempt
	rdGot  uint32 // READ: bytes of response received
	rdFrom uint32 // READ: the byte the latest request asked from
	rdGap  bool   // READ: the rest was asked for again after a lost response; atomic: sent again after an implied NAK
	done   bool   // READ or atomic: the response arrived
}

func (w *swqe) lastPSN() uint32 { return (w.psn + w.npkts - 1) & roce.PSNMask }

func (w *swqe) rdAtomic() bool { return w.class == classRead || w.class == classAtomic }

// requester is the send side of a QP. A message reads and writes nearly
// all of it, so it is kept small: with the QP's send queue ring it fills
// three cache lines (see qp). Its times are instants, 8 bytes where a
// time.Time takes 24.
type requester struct {
	head      uint32 // next SQ index to fetch
	psn       uint32 // PSN of the next new WQE
	high      uint32 // PSN after the highest sent: below it, sending again is a retransmission
	acked     uint32 // last PSN acknowledged
	cwnd      uint32 // congestion window: packets that may be unacknowledged
	ssthresh  uint32 // below it the window doubles each round trip, above it grows by one
	cwndAcc   uint32 // packets acknowledged toward the next window increase
	probePSN  uint32
	nakPSN    uint32
	heapIdx   int32 // the QP's place in the engine's timer heap, -1 when absent
	scheduled bool
	probing   bool // a round-trip sample is under way
	// nakDone: a sequence NAK for nakPSN was acted on (the requester went
	// back to nakPSN) and nothing was acknowledged since, so another NAK
	// for nakPSN is a copy the network made or held back, not news.
	nakDone   bool
	retries   uint8 // transport retries left
	lateLeft  uint8 // late timeouts still forgiven (see timeout)
	rnrLeft   uint8 // RNR retries left
	drainSent bool
	sendIdx   int32   // first WQE of q with packets to send
	rdAtomic  int32   // READs and atomics sent and not answered
	q         []*swqe // outstanding, oldest first; a window into qbuf's array
	// The array q lives in, reused as q slides forward. Next to q: a
	// message that empties q, or fills it to its array's end, reads it.
	qbuf     []*swqe
	srtt     time.Duration // smoothed round-trip time, 0 before the first sample
	rttvar   time.Duration
	probeAt  instant
	rnrUntil instant // the end of an RNR wait; zero when not waiting
	timerAt  instant // when the QP's timer fires; zero when not set
	heapAt   instant // when the QP is queued in the engine's timer heap: at or before timerAt
}

// reset forgets everything outstanding, giving the WQE records back to
// pool.
func (r *requester) reset(pool *wqePool) {
	for _, w := range r.q {
		pool.put(w)
	}
	clear(r.q)
	*r = requester{q: r.qbuf[:0], qbuf: r.qbuf, heapIdx: r.heapIdx, heapAt: r.heapAt}
}

// push appends a fetched WQE. When q has reached the end of its array and
// the array's front is free, q slides back to the front instead of growing.
func (r *requester) push(w *swqe) {
	if len(r.q) == cap(r.q) && cap(r.qbuf) >= 2*len(r.q)+1 {
		n := copy(r.qbuf[:len(r.q)], r.q)
		clear(r.qbuf[n:cap(r.qbuf)])
		r.q = r.qbuf[:n]
	}
	r.q = append(r.q, w)
	if cap(r.q) > cap(r.qbuf) { // append moved q to a new array
		r.qbuf = r.q[:0]
	}
}

// popFront drops the oldest WQE.
func (r *requester) popFront() {
	r.q[0] = nil
	r.q = r.q[1:]
	if len(r.q) == 0 {
		r.q = r.qbuf[:0]
	}
}

// remove drops the WQE at index i.
func (r *requester) remove(i int) {
	copy(r.q[i:], r.q[i+1:])
	r.q[len(r.q)-1] = nil
	r.q = r.q[:len(r.q)-1]
}

// start arms the requester at RTS.
func (r *requester) start(q *qp) {
	r.psn = q.sqPSN
	r.high = q.sqPSN
	r.acked = (q.sqPSN - 1) & roce.PSNMask
	r.refill(q)
	r.rnrLeft = q.rnrRetry
	r.cwnd, r.ssthresh = initialWindow, sendWindow
}

// refill gives the requester its retry_cnt retries again, and as many late
// timeouts forgiven (see Device.timeout): at RTS and on progress.
func (r *requester) refill(q *qp) { r.retries, r.lateLeft = q.retryCnt, q.retryCnt }

// The send window: a software device paced by its peer's CPU rather than
// by a link, so the requester keeps a congestion window as TCP does. It
// starts at initialWindow, doubles each round trip up to ssthresh, then
// grows by one per round trip; a sign of loss (a sequence NAK, a response
// found missing, a timeout) halves it.
const initialWindow = 64

func (r *requester) congested() {
	r.ssthresh = max(r.cwnd/2, minWindow)
	r.cwnd = r.ssthresh
	r.cwndAcc = 0
	r.probing = false
}

// grow widens the window for packets acknowledged.
func (r *requester) grow(acked uint32) {
	if r.cwnd < r.ssthresh {
		r.cwnd = min(r.cwnd+acked, r.ssthresh)
		return
	}
	r.cwndAcc += acked
	for r.cwndAcc >= r.cwnd && r.cwnd < sendWindow {
		r.cwndAcc -= r.cwnd
		r.cwnd++
	}
}

// sampleRTT folds a round-trip measurement into the estimate (RFC 6298).
func (r *requester) sampleRTT(rtt time.Duration) {
	if r.srtt == 0 {
		r.srtt, r.rttvar = rtt, rtt/2
		return
	}
	dev := r.srtt - rtt
	if dev < 0 {
		dev = -dev
	}
	r.rttvar = (3*r.rttvar + dev) / 4
	r.srtt = (7*r.srtt + rtt) / 8
}

// rto is how long the requester waits for an acknowledgement before it
// sends again: the QP's timeout, or more if the measured round trip says
// the peer needs more, so that a slow peer is not flooded with
// retransmissions of what it is still working through. Each retry spent
// without progress since the last doubles it, as TCP backs off, up to 8
// times the timeout or maxBackoff, whichever is more: the QP's timeout is
// the least the requester waits, and a peer that is alive but not
// scheduled for a while (a loaded host running software HCAs: their
// processes, or both devices of one process, wait for a CPU for tens of
// milliseconds) is not declared dead after retry_cnt short waits. With
// the 7 retries of a usual QP and a timeout of 1 ms, RETRY_EXC_ERR comes
// after 267 ms without an answer, where an HCA gives up after 8 ms; with
// comm's 67 ms (timeout 14), after 3.2 s. The backoff does not change how
// many timeouts spend a retry before RETRY_EXC_ERR (late ones do not: see
// timeout).
func (d *Device) rto(q *qp) time.Duration {
	r := &q.req
	base := max(ackTimeout(q.timeout), r.srtt+4*r.rttvar)
	if used := int(q.retryCnt) - int(r.retries); used > 0 {
		return min(base<<used, max(base<<3, maxBackoff)) // used ≤ 7, base < 2^43: no overflow
	}
	return base
}

// maxBackoff is the least bound of the doubling of rto (see rto).
const maxBackoff = 256 * time.Millisecond

// wqePool is an engine's free list of send WQE records, shared by the QPs
// of the device. The records in use at a time are the WQEs outstanding, so
// a few serve any number of QPs, and taking the one freed last keeps them
// in the CPU's cache, however many QPs take turns. Guarded by d.mu.
type wqePool struct {
	free []*swqe
}

// wqePoolMax bounds the records a pool keeps; more are left to the
// garbage collector.
const wqePoolMax = 4096

func (p *wqePool) get() *swqe {
	if n := len(p.free); n > 0 {
		w := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		return w
	}
	return &swqe{}
}

func (p *wqePool) put(w *swqe) {
	w.w.SG, w.w.Inline, w.sg = w.w.SG[:0], w.w.Inline[:0], w.sg[:0]
	w.sent, w.rdGot, w.rdFrom, w.rdGap, w.done = 0, 0, 0, false, false
	if len(p.free) < wqePoolMax {
		p.free = append(p.free, w)
	}
}

// sqOwned reports whether the client has posted the SQ slot at index i: its
// owner bit matches the pass of i.
func sqOwned(q *qp, i uint32) bool {
	if q.sq.cnt == 0 {
		return false // an XRC receive QP has no send queue
	}
	oo := mlx4hw.OwnerOpcode(q.sq.slot(i))
	return (oo&mlx4hw.OwnerBit != 0) == (i&q.sq.cnt != 0)
}

// pump fetches posted WQEs and sends what the windows allow. Caller holds
// d.mu.
func (d *Device) pump(q *qp) {
	r := &q.req
	switch q.state {
	case qpstate.RTS, qpstate.SQD:
	case qpstate.Err:
		d.flushPosted(q)
		return
	default:
		return // WQEs posted before RTS wait for it
	}
	now := d.eng.nowI
	if r.rnrUntil != 0 && now < r.rnrUntil {
		return
	}
	if r.rnrUntil != 0 {
		// The RNR wait is over before its timer fired: the timer is the
		// transport timer again.
		r.rnrUntil = 0
		d.eng.setTimer(q, 0)
	}
	if q.state == qpstate.RTS && !d.fetchPosted(q) {
		return
	}
	for int(r.sendIdx) < len(r.q) {
		w := r.q[r.sendIdx]
		if w.sent == 0 && (w.w.Fence && r.rdAtomic > 0 || w.rdAtomic() && r.rdAtomic >= int32(max(q.maxRdAtomic, 1))) {
			break
		}
		if w.sent == 0 && (w.lastPSN()-r.acked)&roce.PSNMask > roce.MaxMessagePackets {
			// Its last PSN would lie half the PSN space or more past the
			// last acknowledged one, where PSN comparisons cannot tell
			// it from an old one: it waits for the requests before it.
			break
		}
		if w.rdAtomic() {
			// One request packet; the responses take up the rest of
			// the PSNs.
			if w.sent == 0 {
				d.sendRequests(q, w, 0, 1) // no data to read: cannot fail
				w.sent = w.npkts
			}
		}
		for w.sent < w.npkts {
			// The packets the window allows from here on, up to a run.
			ahead := roce.PSNDiff((w.psn+w.sent)&roce.PSNMask, r.acked)
			if ahead > int32(r.cwnd) {
				break
			}
			n := min(w.npkts-w.sent, uint32(int32(r.cwnd)-ahead)+1, maxRun)
			if !d.sendRequests(q, w, w.sent, n) {
				return // a local error: the QP is in the error state
			}
			w.sent += n
		}
		if w.sent < w.npkts {
			break
		}
		if w.rdAtomic() && !w.done {
			r.rdAtomic++
		}
		r.sendIdx++
	}
	if len(r.q) > 0 && r.timerAt == 0 && q.timeout != 0 {
		d.eng.setTimer(q, now.add(d.rto(q)))
	}
	if q.state == qpstate.SQD && len(r.q) == 0 && q.sqdNotify && !r.drainSent {
		r.drainSent = true
		d.qpEvent(q, evSQDrained)
	}
}

// fetchPosted takes the WQEs the client has posted into the requester, up
// to its limit. It reports false if one failed, which put the QP in error.
func (d *Device) fetchPosted(q *qp) bool {
	r := &q.req
	for len(r.q) < maxOutstanding && sqOwned(q, r.head) {
		w := d.eng.wqes.get()
		w.idx = r.head
		r.head++
		r.push(w)
		if syn, ok := d.fetch(q, w); !ok {
			d.requestError(q, w, syn)
			return false
		}
	}
	return true
}

// ackTimeout is the transport timer of a QP: 4.096 µs × 2^timeout.
func ackTimeout(t uint8) time.Duration { return 4096 * time.Nanosecond << t }

// fetch decodes the WQE of w and resolves its local memory. It reports the
// syndrome of a local error.
func (d *Device) fetch(q *qp, w *swqe) (uint8, bool) {
	w.w.SG, w.w.Inline, w.sg = w.w.SG[:0], w.w.Inline[:0], w.sg[:0]
	if err := mlx4hw.DecodeSendWQE(q.sq.slot(w.idx), &w.w); err != nil {
		return mlx4hw.SyndromeLocalQPOpErr, false
	}
	switch w.w.Opcode {
	case mlx4hw.OpSend, mlx4hw.OpSendImm:
		w.class = classSend
	case mlx4hw.OpRDMAWrite, mlx4hw.OpRDMAWriteImm:
		w.class = classWrite
	case mlx4hw.OpRDMARead:
		w.class = classRead
	case mlx4hw.OpAtomicCS, mlx4hw.OpAtomicFA:
		w.class = classAtomic
	default:
		return mlx4hw.SyndromeLocalQPOpErr, false
	}
	if w.w.HasInline {
		if w.rdAtomic() || len(w.w.Inline) > maxInline {
			return mlx4hw.SyndromeLocalQPOpErr, false
		}
		w.length = uint32(len(w.w.Inline))
	} else {
		total := uint64(0)
		for _, s := range w.w.SG {
			if s.ByteCount == 0 {
				continue
			}
			m := d.lookupMR(s.LKey)
			if m == nil || m.pd != q.pd || !m.contains(s.Addr, uint64(s.ByteCount)) ||
				w.rdAtomic() && m.access&accLocalWrite == 0 {
				return mlx4hw.SyndromeLocalProtErr, false
			}
			w.sg = append(w.sg, lsge{m: m, va: s.Addr, n: s.ByteCount})
			total += uint64(s.ByteCount)
		}
		if total > 1<<31 {
			return mlx4hw.SyndromeLocalLengthErr, false
		}
		w.length = uint32(total)
	}
	mtu := q.mtu()
	switch w.class {
	case classAtomic:
		if w.length < 8 {
			return mlx4hw.SyndromeLocalLengthErr, false
		}
		w.npkts = 1
	default:
		w.npkts = max(1, (w.length+mtu-1)/mtu)
		if w.npkts > roce.MaxMessagePackets {
			return mlx4hw.SyndromeLocalLengthErr, false
		}
	}
	w.psn = q.req.psn
	q.req.psn = (q.req.psn + w.npkts) & roce.PSNMask
	return 0, true
}

// contains reports whether [va, va+n) lies in the region.
func (m *mr) contains(va, n uint64) bool { return within(m.iova, m.length, va, n) }

// maxRun is the most packets of one message sendRequests builds at once,
// and reads with one call per region of the message's memory (one
// process_vm_readv when the memory is in another process, which takes up
// to 64 buffers: internal/unix's maxVMIovecs).
const maxRun = 64

// sendRequests sends packets k to k+n-1 of w, reading their data from
// memory at once (gatherRun). It reports false if the request's memory
// could not be read, which put the QP in the error state; none of the
// packets is sent then.
func (d *Device) sendRequests(q *qp, w *swqe, k, n uint32) bool {
	ps, bufs := d.eng.runPkts[:0], d.eng.runBufs[:0]
	data := w.class == classSend || w.class == classWrite
	for i := k; i < k+n; i++ {
		p := d.buildRequest(q, w, i)
		if data {
			bufs = append(bufs, p.Payload)
		}
		ps = append(ps, p)
	}
	ok := !data || borrowRun(w, k*q.mtu(), ps) || d.gatherRun(w, k*q.mtu(), bufs)
	d.eng.endPacketRun(ps, bufs, ok)
	if !ok {
		d.requestError(q, w, mlx4hw.SyndromeLocalProtErr)
	}
	return ok
}

// buildRequest makes packet k of w, all but the data of a SEND or WRITE:
// its payload has the length it will have, for the caller to fill.
func (d *Device) buildRequest(q *qp, w *swqe, k uint32) *roce.Packet {
	r := &q.req
	p := d.newPacket(q)
	p.PSN = (w.psn + k) & roce.PSNMask
	if roce.PSNDiff(p.PSN, r.high) < 0 {
		d.counters.Retransmits.Add(1)
	} else {
		r.high = (p.PSN + 1) & roce.PSNMask
		if !r.probing { // time a packet sent once (Karn's rule)
			r.probing, r.probePSN, r.probeAt = true, p.PSN, d.eng.nowI
		}
	}
	first, last := k == 0, k == w.npkts-1
	mtu := q.mtu()
	off := k * mtu
	n := min(mtu, w.length-min(off, w.length))
	imm := w.w.Opcode == mlx4hw.OpSendImm || w.w.Opcode == mlx4hw.OpRDMAWriteImm
	switch w.class {
	case classSend, classWrite:
		p.Opcode = messageOpcode(w.class == classSend, first, last, imm)
		if first && w.class == classWrite {
			p.VA, p.RKey, p.DMALen = w.w.RemoteAddr, w.w.RKey, w.length
		}
		if last {
			p.Imm = w.w.Imm
			p.SE = w.w.Flags&mlx4hw.CtrlSolicit != 0
			p.AckReq = true
		}
		p.Payload = p.Payload[:n]
		// Ask for an acknowledgement now and then inside long messages, so
		// that the send window keeps moving, and when the packet fills the
		// window.
		p.AckReq = p.AckReq || p.PSN%ackEvery == ackEvery-1 ||
			roce.PSNDiff(p.PSN, r.acked) >= int32(r.cwnd)
	case classRead:
		// After a lost response, ask for the rest only: the request's
		// PSN is the first missing response's, its RETH the rest.
		got := w.rdGot / mtu * mtu
		w.rdFrom = got
		p.Opcode = roce.ReadRequest
		p.PSN = (w.psn + got/mtu) & roce.PSNMask
		p.VA, p.RKey, p.DMALen = w.w.RemoteAddr+uint64(got), w.w.RKey, w.length-got
		p.AckReq = true
	case classAtomic:
		p.Opcode = roce.CompareSwap
		if w.w.Opcode == mlx4hw.OpAtomicFA {
			p.Opcode = roce.FetchAdd
		}
		p.VA, p.RKey, p.SwapAdd, p.Compare = w.w.RemoteAddr, w.w.RKey, w.w.SwapAdd, w.w.Compare
		p.AckReq = true
	}
	if w.rdAtomic() && roce.PSNDiff(w.lastPSN(), r.high) >= 0 {
		r.high = (w.lastPSN() + 1) & roce.PSNMask // the responses' PSNs
	}
	if q.xport == roce.TransportXRC {
		p.Opcode |= roce.TransportXRC
		p.XRCSRQ = w.w.RemoteSRQN
	}
	return p
}

// messageOpcode picks the SEND or RDMA WRITE opcode of a packet by its place
// in the message.
func messageOpcode(send, first, last, imm bool) roce.Opcode {
	switch {
	case send && first && last && imm:
		return roce.SendOnlyImm
	case send && first && last:
		return roce.SendOnly
	case send && first:
		return roce.SendFirst
	case send && last && imm:
		return roce.SendLastImm
	case send && last:
		return roce.SendLast
	case send:
		return roce.SendMiddle
	case first && last && imm:
		return roce.WriteOnlyImm
	case first && last:
		return roce.WriteOnly
	case first:
		return roce.WriteFirst
	case last && imm:
		return roce.WriteLastImm
	case last:
		return roce.WriteLast
	}
	return roce.WriteMiddle
}

// newPacket returns a packet addressed to the QP's peer, from the engine's
// packet cache: only the engine goroutine builds packets.
func (d *Device) newPacket(q *qp) *roce.Packet {
	p := d.eng.pkts.get()
	p.SrcGID = d.gid
	p.DstGID = q.dgid
	p.DestQP = q.destQPN
	p.PKey = 0xffff
	return p
}

// borrowRun points the payloads of a run of packets, from byte off of w's
// data, at the data itself (mr.lend) when all of it lies in one region the
// device maps. It reports false, and changes nothing, for data it cannot
// borrow.
func borrowRun(w *swqe, off uint32, ps []*roce.Packet) bool {
	if w.w.HasInline {
		return false
	}
	s, o, ok := sgeAt(w.sg, off)
	if !ok {
		return false
	}
	var n uint32
	for _, p := range ps {
		n += uint32(len(p.Payload))
	}
	return n <= s.n-o && s.m.lend(s.va+uint64(o), ps)
}

// gatherRun fills the buffers of bufs in turn with the request's data from
// byte off, as if they were one, reading each region's part with one call
// (mr.readv). It reports false if a region could not be read.
func (d *Device) gatherRun(w *swqe, off uint32, bufs [][]byte) bool {
	if w.w.HasInline {
		for _, b := range bufs {
			off += uint32(copy(b, w.w.Inline[off:]))
		}
		return true
	}
	part := d.eng.gatherBufs[:0]
	defer func() { clear(part[:cap(part)]); d.eng.gatherBufs = part[:0] }()
	for _, s := range w.sg {
		if len(bufs) == 0 {
			break
		}
		if off >= s.n {
			off -= s.n
			continue
		}
		// The buffers, or their parts, that this element's bytes from
		// off fill.
		part = part[:0]
		room := s.n - off
		for room > 0 && len(bufs) > 0 {
			b := bufs[0]
			if uint32(len(b)) > room {
				part = append(part, b[:room])
				bufs[0] = b[room:]
				room = 0
				break
			}
			part = append(part, b)
			room -= uint32(len(b))
			bufs = bufs[1:]
		}
		if !s.m.readv(s.va+uint64(off), part) {
			return false
		}
		off = 0
	}
	for _, b := range bufs { // left over: nothing, or the empty payload of a message with no data
		if len(b) > 0 {
			return false
		}
	}
	return true
}

// scatter copies src into a scatter list from byte off. It reports false
// if a region could not be written (it was deregistered, or its memory is
// gone).
func scatter(sg []lsge, off uint32, src []byte) bool {
	for _, s := range sg {
		if len(src) == 0 {
			return true
		}
		if off >= s.n {
			off -= s.n
			continue
		}
		n := min(s.n-off, uint32(len(src)))
		if !s.m.write(s.va+uint64(off), src[:n]) {
			return false
		}
		src = src[n:]
		off = 0
	}
	return true
}

// onResponse handles an acknowledgement or a response on the requester
// side. Caller holds d.mu.
func (d *Device) onResponse(q *qp, p *roce.Packet) {
	r := &q.req
	if q.state != qpstate.RTS && q.state != qpstate.SQD {
		d.counters.RcvErrors.Add(1) // the requester is not running: a stray response
		return
	}
	if len(r.q) == 0 {
		if roce.PSNDiff(p.PSN, r.acked) > 0 {
			d.counters.RcvErrors.Add(1) // responds to what was never sent
		}
		return // else a duplicate of what was acknowledged
	}
	op := p.Opcode.Op()
	if op != roce.Acknowledge && roce.PSNDiff(p.PSN, r.acked) <= 0 {
		d.answeredAgain(q)
		return
	}
	switch op {
	case roce.Acknowledge:
		d.onAck(q, p)
	case roce.ReadResponseFirst, roce.ReadResponseMiddle, roce.ReadResponseLast, roce.ReadResponseOnly:
		d.onReadResponse(q, p)
	case roce.AtomicAcknowledge:
		d.onAtomicAck(q, p)
	}
	if !q.destroyed && q.state != qpstate.Err {
		d.eng.schedule(q)
	}
}

// answeredAgain handles a response to a READ or an atomic that completed
// already: the responder answers a copy of the request, which the network
// duplicated or which was sent again while the first answer was on its
// way. That is no error, and it tells that the responder is working
// through the requests in order: the acknowledgements of the requests
// after this one come after these responses. The transport timer starts
// over, the retries left as they are, so that a copy of a long READ,
// answered again in full, does not use up retry_cnt while a later request
// waits for its acknowledgement. A dead responder answers nothing and
// still runs the timer out. Caller holds d.mu; r.q is not empty.
func (d *Device) answeredAgain(q *qp) {
	r := &q.req
	if q.timeout != 0 && r.rnrUntil == 0 && r.timerAt != 0 {
		d.eng.setTimer(q, d.eng.nowI.add(d.rto(q)))
	}
}

func (d *Device) onAck(q *qp, p *roce.Packet) {
	r := &q.req
	if d.debug {
		d.log.Debug("ack", "qp", q.num, "syndrome", p.Syndrome, "psn", p.PSN, "acked", r.acked, "cwnd", r.cwnd, "outstanding", len(r.q))
	}
	switch p.Syndrome & roce.AETHKind {
	case roce.AETHAck:
		d.acked(q, p.PSN)
	case roce.AETHRNRNak:
		d.counters.RNRNaksReceived.Add(1)
		if !d.nakApplies(q, p.PSN) {
			return
		}
		if r.rnrUntil != 0 {
			// Still waiting after an RNR NAK for this PSN, nothing
			// sent since: a copy, which must not cost a retry.
			return
		}
		if q.rnrRetry != 7 {
			if r.rnrLeft == 0 {
				d.counters.ReqRNRRetriesExceeded.Add(1)
				d.requestError(q, r.q[0], mlx4hw.SyndromeRNRRetryExcErr)
				return
			}
			r.rnrLeft--
		}
		d.counters.RNRNakRetryErr.Add(1)
		d.rewind(q, p.PSN)
		r.rnrUntil = d.eng.nowI.add(rnrDelay(p.Syndrome & 0x1f))
		d.eng.setTimer(q, r.rnrUntil)
	case roce.AETHNak:
		if !d.nakApplies(q, p.PSN) {
			return
		}
		code := p.Syndrome & 0x1f
		if code == roce.NakPSNSeqErr {
			d.counters.PacketSeqErr.Add(1)
			if r.nakDone && p.PSN == r.nakPSN {
				// The responder NAKs a gap once and then drops what
				// comes until the gap is filled: a second NAK for the
				// same PSN with no progress between is a duplicate. It
				// must not cost a retry or send the window again.
				return
			}
			r.nakDone, r.nakPSN = true, p.PSN
			if r.retries == 0 {
				d.requestError(q, r.q[0], mlx4hw.SyndromeRetryExcErr)
				return
			}
			r.retries--
			r.congested()
			d.rewind(q, p.PSN)
			return
		}
		syn := uint8(mlx4hw.SyndromeRemoteOpErr)
		switch code {
		case roce.NakInvalidRequest, roce.NakInvalidRDReq:
			syn = mlx4hw.SyndromeRemoteInvalReqErr
		case roce.NakRemoteAccess:
			syn = mlx4hw.SyndromeRemoteAccessErr
		}
		d.requestError(q, d.wqeAt(q, p.PSN), syn)
	default: // the reserved kind, 0x40
		d.counters.RcvErrors.Add(1)
	}
}

// nakApplies acknowledges what comes before the PSN of a NAK or an RNR
// NAK, and reports whether the NAK is then for the oldest request still
// outstanding, as it must be to count. A NAK for a PSN acknowledged already
// is a duplicate; one for a PSN never sent is counted as an error; one past
// a READ or an atomic whose response has not come tells that the response
// was lost: acked sends the request again, and the NAK is dropped, as the
// responder will answer the request again before it gets to the NAKed one.
// Dropping it also keeps completions in order: a request failed by a NAK
// has no older request outstanding, to be flushed before it.
func (d *Device) nakApplies(q *qp, psn uint32) bool {
	r := &q.req
	if roce.PSNDiff(psn, r.acked) <= 0 {
		return false
	}
	if roce.PSNDiff(psn, r.high) >= 0 {
		d.counters.RcvErrors.Add(1) // refuses what was never sent
		return false
	}
	before := (psn - 1) & roce.PSNMask
	d.acked(q, before)
	return (q.state == qpstate.RTS || q.state == qpstate.SQD) && len(r.q) > 0 && r.acked == before
}

// wqeAt returns the outstanding WQE that holds psn, or the oldest.
func (d *Device) wqeAt(q *qp, psn uint32) *swqe {
	for _, w := range q.req.q {
		if dd := roce.PSNDiff(psn, w.psn); dd >= 0 && uint32(dd) < w.npkts {
			return w
		}
	}
	return q.req.q[0]
}

// acked completes the WQEs that psn acknowledges, oldest first.
func (d *Device) acked(q *qp, psn uint32) {
	r := &q.req
	if roce.PSNDiff(psn, r.acked) <= 0 {
		return
	}
	if roce.PSNDiff(psn, r.high) >= 0 {
		d.counters.RcvErrors.Add(1) // acknowledges what was never sent
		return
	}
	progress := false
	for len(r.q) > 0 && q.state != qpstate.Err {
		w := r.q[0]
		if roce.PSNDiff(w.lastPSN(), psn) > 0 {
			break
		}
		if w.rdAtomic() && !w.done {
			// Acknowledged past a READ or atomic whose response never
			// came: it was lost.
			d.counters.ImpliedNakSeqErr.Add(1)
			r.congested()
			d.rewind(q, w.psn)
			// What it acknowledged past the READ is acknowledged again
			// after the READ's responses; r.acked stays before them.
			psn = (w.psn - 1) & roce.PSNMask
			break
		}
		d.completeSend(q, w)
		progress = true
	}
	if dd := roce.PSNDiff(psn, r.acked); dd > 0 {
		r.grow(uint32(dd))
		r.acked = psn
		progress = true
		if r.probing && roce.PSNDiff(psn, r.probePSN) >= 0 {
			r.probing = false
			r.sampleRTT(d.eng.nowI.sub(r.probeAt))
		}
	}
	if progress {
		r.refill(q)
		r.rnrLeft = q.rnrRetry
		r.nakDone = false
		// The responder took what an RNR NAK had refused (the NAK was
		// a late copy): no wait holds the QP back any more.
		r.rnrUntil = 0
		if len(r.q) == 0 || q.timeout == 0 {
			d.eng.setTimer(q, 0)
		} else if r.rnrUntil == 0 {
			d.eng.setTimer(q, d.eng.nowI.add(d.rto(q)))
		}
	}
}

// completeSend retires the oldest WQE successfully.
func (d *Device) completeSend(q *qp, w *swqe) {
	r := &q.req
	if w.w.Signaled() {
		e := mlx4hw.CQE{MyQPN: q.num, WQEIndex: uint16(w.idx), IsSend: true, Opcode: w.w.Opcode}
		if w.class == classRead {
			e.ByteCnt = w.length
		}
		d.push(q.scq, &e, false)
	}
	r.popFront()
	r.sendIdx = max(r.sendIdx-1, 0)
	d.eng.wqes.put(w)
}

// awaited returns the oldest READ or atomic whose response has not come,
// if a response with PSN psn can be for a request that was sent; else it
// counts the response as an error.
func (d *Device) awaited(q *qp, psn uint32) *swqe {
	r := &q.req
	for _, w := range r.q {
		if w.rdAtomic() && !w.done {
			if w.sent == 0 || roce.PSNDiff(psn, r.high) >= 0 {
				break
			}
			return w
		}
	}
	d.counters.RcvErrors.Add(1) // a response to a request never sent
	return nil
}

// otherResponse handles a response that is not the one w awaits (a READ
// response where an atomic's is due, or the reverse). Responses come in
// PSN order, so one past w tells that w's was lost (an implied NAK): w is
// sent again, once until its response comes. One inside w's PSNs is of the
// wrong kind, an error; one before them a late copy.
func (d *Device) otherResponse(q *qp, w *swqe, psn uint32) {
	switch {
	case roce.PSNDiff(psn, w.lastPSN()) > 0:
		if !w.rdGap {
			w.rdGap = true
			d.counters.ImpliedNakSeqErr.Add(1)
			q.req.congested()
			d.rewind(q, w.psn)
		}
	case roce.PSNDiff(psn, w.psn) >= 0:
		d.counters.RcvErrors.Add(1)
	}
}

func (d *Device) onReadResponse(q *qp, p *roce.Packet) {
	r := &q.req
	w := d.awaited(q, p.PSN)
	if w == nil {
		return
	}
	if w.class != classRead {
		d.otherResponse(q, w, p.PSN)
		return
	}
	mtu := q.mtu()
	want := (w.psn + w.rdGot/mtu) & roce.PSNMask
	if dd := roce.PSNDiff(p.PSN, want); dd != 0 {
		// A response packet was lost: ask for the rest again, once; the
		// responses still on their way behind the gap are dropped until
		// the one asked for comes.
		if dd > 0 && !w.rdGap {
			w.rdGap = true
			d.counters.ImpliedNakSeqErr.Add(1)
			r.congested()
			d.rewind(q, w.psn)
		}
		return
	}
	w.rdGap = false
	d.acked(q, (w.psn-1)&roce.PSNMask) // a response acknowledges what came before
	// Each response in order is progress: the retries start over.
	r.refill(q)
	if q.timeout != 0 {
		d.eng.setTimer(q, d.eng.nowI.add(d.rto(q)))
	}
	n := uint32(len(p.Payload))
	first, last := p.Opcode.IsFirst(), p.Opcode.IsLast()
	// A response stream starts (FIRST or ONLY) where a request asked it
	// to, and ends (LAST or ONLY) with the READ's last byte. At a byte
	// asked for again either may come: the first stream's packet there
	// may have been late, not lost. No response carries more than an MTU:
	// the READ's PSNs are its bytes in MTUs. The AETH of a FIRST, LAST or
	// ONLY is an ACK: a responder NAKs with an Acknowledge, never with a
	// response (rxe_comp.c's check_ack fails the request too).
	start := w.rdGot == 0 || w.rdGot == w.rdFrom
	if (first || last) && p.Syndrome&roce.AETHKind != roce.AETHAck || n > mtu || first && !start || !first && w.rdGot == 0 || w.rdGot+n > w.length ||
		!last && (n != mtu || w.rdGot+n == w.length) || last && w.rdGot+n != w.length {
		if d.debug {
			d.log.Debug("bad read response", "op", p.Opcode, "psn", p.PSN, "wpsn", w.psn, "npkts", w.npkts, "rdGot", w.rdGot, "n", n, "length", w.length)
		}
		d.requestError(q, w, mlx4hw.SyndromeBadRespErr) // drops its run (dropRun)
		return
	}
	if !d.placeRead(q, w, p) {
		d.requestError(q, w, mlx4hw.SyndromeLocalProtErr)
		return
	}
	w.rdGot += n
	if last {
		// The READ completes: its bytes must be in memory first.
		if !d.flushRun() {
			d.requestError(q, w, mlx4hw.SyndromeLocalProtErr)
			return
		}
		w.done = true
		r.rdAtomic--
		d.acked(q, p.PSN)
	}
}

func (d *Device) onAtomicAck(q *qp, p *roce.Packet) {
	w := d.awaited(q, p.PSN)
	if w == nil {
		return
	}
	if w.class != classAtomic || w.psn != p.PSN {
		d.otherResponse(q, w, p.PSN)
		return
	}
	d.acked(q, (w.psn-1)&roce.PSNMask)
	if p.Syndrome&roce.AETHKind != roce.AETHAck { // a NAK is an Acknowledge, not a response
		d.requestError(q, w, mlx4hw.SyndromeBadRespErr)
		return
	}
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], p.OrigData)
	if !scatter(w.sg, 0, b[:]) {
		d.requestError(q, w, mlx4hw.SyndromeLocalProtErr)
		return
	}
	w.done = true
	q.req.rdAtomic--
	d.acked(q, p.PSN)
}

// rewind makes the requester send again from psn (the oldest outstanding
// WQE if psn is not in one).
func (d *Device) rewind(q *qp, psn uint32) {
	r := &q.req
	if len(r.q) == 0 {
		return
	}
	i := 0
	for j, w := range r.q {
		if dd := roce.PSNDiff(psn, w.psn); dd >= 0 && uint32(dd) < w.npkts {
			i = j
			break
		}
	}
	for j := i; j < len(r.q); j++ {
		w := r.q[j]
		if w.rdAtomic() && w.done {
			continue // its response is in memory: nothing to ask again
		}
		w.sent, w.done = 0, false
		if j > i {
			w.rdGot = 0
		}
	}
	if w := r.q[i]; !w.rdAtomic() {
		if dd := roce.PSNDiff(psn, w.psn); dd > 0 && uint32(dd) < w.npkts {
			w.sent = uint32(dd) // resume a message in its middle
		}
	}
	r.sendIdx = int32(i)
	r.probing = false
	r.rdAtomic = 0
	for _, w := range r.q[:i] {
		if w.rdAtomic() && !w.done {
			r.rdAtomic++
		}
	}
}

// timeout handles a requester timer: the end of an RNR wait, or the
// transport timer, which retries or gives up.
//
// A transport timer handled (at now) late by more than its timeout, and by
// more than lateSlack, tells of the device's own stall (its process was
// not scheduled) rather than of the path: the peer's answers may be
// waiting, unread, and in one process the peer device stalled too. Such a
// timeout goes back and sends again but counts against neither retry_cnt
// nor the send window (a stall is no sign of congestion), up to retry_cnt
// late timeouts between two acknowledgements that make progress: a loaded
// host must not turn into RETRY_EXC_ERR for a path that works, and a dead
// peer still fails the QP, after at most twice the retries.
func (d *Device) timeout(q *qp, now instant) {
	r := &q.req
	due := r.timerAt
	r.timerAt = 0
	if q.state != qpstate.RTS && q.state != qpstate.SQD {
		return
	}
	if r.rnrUntil != 0 {
		r.rnrUntil = 0
		d.eng.schedule(q)
		return
	}
	if len(r.q) == 0 {
		return
	}
	d.counters.AckTimeouts.Add(1)
	if r.lateLeft > 0 && now.sub(due) > max(d.rto(q), lateSlack) {
		r.lateLeft--
		d.counters.LateTimeouts.Add(1)
		d.counters.LocalAckTimeoutErr.Add(1)
		if d.debug {
			d.log.Debug("late timeout", "qp", q.num, "acked", r.acked, "high", r.high, "late_left", r.lateLeft)
		}
		d.rewind(q, (r.acked+1)&roce.PSNMask)
		d.eng.schedule(q)
		return
	}
	if r.retries == 0 {
		d.counters.ReqTransportRetriesExceeded.Add(1)
		d.requestError(q, r.q[0], mlx4hw.SyndromeRetryExcErr)
		return
	}
	d.counters.LocalAckTimeoutErr.Add(1)
	if d.debug {
		d.log.Debug("timeout", "qp", q.num, "acked", r.acked, "high", r.high, "retries", r.retries, "cwnd", r.cwnd)
	}
	r.retries--
	r.congested()
	d.rewind(q, (r.acked+1)&roce.PSNMask)
	d.eng.schedule(q)
}

// requestError completes w with an error syndrome and puts the QP in the
// error state, which flushes everything after it.
func (d *Device) requestError(q *qp, w *swqe, syndrome uint8) {
	r := &q.req
	d.counters.LocalErrors.Add(1)
	// Completions come in order: the WQEs older than w, still waiting for
	// their acknowledgement, are flushed first.
	for len(r.q) > 0 && r.q[0] != w {
		old := r.q[0]
		d.flushCQE(q.scq, q.num, old.idx, true)
		r.popFront()
		d.eng.wqes.put(old)
	}
	e := mlx4hw.CQE{MyQPN: q.num, WQEIndex: uint16(w.idx), IsSend: true, Opcode: mlx4hw.CQEOpError, Syndrome: syndrome}
	d.push(q.scq, &e, true)
	if len(r.q) > 0 {
		r.popFront()
		d.eng.wqes.put(w)
	}
	d.setState(q, qpstate.Err)
}

// rnrDelay decodes an RNR timer field (IBA table 45).
func rnrDelay(code uint8) time.Duration {
	us := [32]uint32{
		655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
		2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
	}
	return time.Duration(us[code&31]) * time.Microsecond
}
