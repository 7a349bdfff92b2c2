package verbsx

import (
	"fmt"

	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/verbs"
)

// Progress applies what the lazy connector and the async events learned,
// then polls the CQ: it delivers received frames to h (in the order each
// rank sent them: one QP per sender, in order), takes credits back, frees
// send buffers and send queue entries, finishes reads (ReadDone), then
// reposts receive buffers, posts waiting reads and returns credits. Last,
// if h is a transport.PeerFailureHandler, it reports the peers that failed
// for good since (report). The handler may call TrySend and Read. It
// returns how many frames, reads and failed peers it delivered.
func (e *Endpoint) Progress(h transport.Handler) (int, error) {
	if e.stopped {
		return 0, e.errClosed("progress")
	}
	if e.Lazy != nil {
		e.Lazy.Apply()
	}
	e.applyQPErrs()
	n := e.Core.Reads.Finish(h)
	k, more, err := e.Core.Poll(func(wc *verbs.WorkCompletion) int { return e.complete(h, wc) }, e.m)
	n += k
	if err != nil {
		return n, fmt.Errorf("%s: %w", e.name, err)
	}
	if more {
		// Completions are left in the CQ, which no event will announce
		// (they came already): a rank that found no frame among those
		// polled must not go to sleep.
		e.kick()
	}
	keep := e.dirtyConns[:0]
	for _, c := range e.dirtyConns {
		e.postReads(c)
		if c.state != ConnFailed && len(c.pending) > 0 {
			keep = append(keep, c)
		} else {
			c.dirty = false
		}
	}
	clear(e.dirtyConns[len(keep):])
	e.dirtyConns = keep
	// Poll has posted the buffers of the frames it delivered again: they
	// may now be told consumed.
	owe := e.dirtyPeers[:0]
	for _, p := range e.dirtyPeers {
		p.cr.Release()
		if e.returnCredits(p) {
			owe = append(owe, p)
		} else {
			p.dirty = false
		}
	}
	clear(e.dirtyPeers[len(owe):])
	e.dirtyPeers = owe
	n += e.Core.Reads.Finish(h)
	if !more {
		n += e.report(h)
	}
	return n, nil
}

// report tells h, if it is a transport.PeerFailureHandler, of the peers
// that failed since the last report, once each, and returns how many.
// Progress reports only once its poll left the CQ empty: the frames a
// peer's QP completed before it failed are delivered first (those
// completions precede a failure that a completion reports, but maybe not
// one an async event reports). Frames of a peer that come after its
// report are dropped (received): the handler was told nothing more comes.
// While the handler is no PeerFailureHandler the failures wait.
func (e *Endpoint) report(h transport.Handler) int {
	pf, ok := h.(transport.PeerFailureHandler)
	if !ok || len(e.failed) == 0 {
		return 0
	}
	failed := e.failed
	e.failed = nil
	for _, p := range failed {
		p.reported = true
		pf.PeerFailed(p.Rank, p.err)
	}
	return len(failed)
}

// qpErr is a QP that an async event said failed.
type qpErr struct {
	qpn uint32
	ev  verbs.EventType
}

// qpFailed queues qpn, which the async event ev said failed, for
// Progress (WatchEvents calls it).
func (e *Endpoint) qpFailed(qpn uint32, ev verbs.EventType) {
	e.qpErrMu.Lock()
	e.qpErrs = append(e.qpErrs, qpErr{qpn, ev})
	e.errsNew.Store(true)
	e.qpErrMu.Unlock()
}

// applyQPErrs fails what the QPs that async events said failed carried.
// A QP in the error state carries nothing more, and may tell nothing more
// either: a QP that fails as a responder (a request it refused: a bad
// key, an XRC SRQ not in its domain) completes no work of this rank's if
// none was posted on it. A Conn's QP fails the Conn (RC's QP: the peer's
// traffic both ways); a receive QP that is no Conn's (XRC's TGT QP of a
// peer's INI QP) fails the peer whose frames it carried: nothing more
// comes from it, to any rank of this node (the TGT QP is the node's), so
// calls toward it fail too, as the peer's own INI QP, refused, failed
// (FailPeer). A QP of neither (closed since) is ignored.
func (e *Endpoint) applyQPErrs() {
	if !e.errsNew.Load() {
		return
	}
	e.qpErrMu.Lock()
	e.errsNew.Store(false)
	errs := e.qpErrs
	e.qpErrs = nil
	dev, failAll := e.devErr, e.isDead() && !e.devApplied
	e.devApplied = e.devApplied || failAll
	e.qpErrMu.Unlock()
	if failAll {
		e.failAll(dev)
	}
	for _, q := range errs {
		if c := e.bySend[q.qpn]; c != nil {
			e.Fail(c, c.Errorf("QP %#x failed: %w", q.qpn, q.ev))
		} else if p := e.byRecv[q.qpn]; p != nil {
			e.FailPeer(p, fmt.Errorf("%s: rank %d: receive QP %#x failed: %w", e.name, p.Rank, q.qpn, q.ev))
		}
	}
}

// failAll fails every Conn and every Peer with ev, the device's failure
// (DEVICE_FATAL, or CQ_ERR of the rank's CQ): no QP of the rank carries
// anything more, and a lazy connection cannot be made. Every later call
// toward a peer returns the error of its Conn, which wraps ev, and
// Progress reports each peer once.
func (e *Endpoint) failAll(ev verbs.EventType) {
	what := "device failed"
	if ev == verbs.EventCQErr {
		what = "CQ failed"
	}
	e.log.Error(what+": failing every peer", "event", ev)
	e.Core.Dead = true
	for _, p := range e.peers {
		if p != nil {
			e.Fail(p.Conn, p.Conn.Errorf("%s: %w", what, ev)) // once a Conn
		}
	}
}

// complete handles one completion and returns 1 if it delivered a frame.
func (e *Endpoint) complete(h transport.Handler, wc *verbs.WorkCompletion) int {
	idx := wc.WRID &^ WRKind
	if wc.WRID&WRKind == WRRecv {
		return e.received(h, wc, uint32(idx))
	}
	c := e.bySend[wc.QPNum]
	if c == nil {
		e.m.Bad.Inc()
		e.log.Warn("completion of an unknown QP", "qpn", wc.QPNum, "wr_id", wc.WRID, "status", wc.Status)
		return 0
	}
	c.sqUsed--
	var err error
	if wc.Status != verbs.WCSuccess {
		e.m.CompletionErrors.Inc()
		if wc.Status == verbs.WCRNRRetryExcErr {
			e.m.RNRExceeded.Inc()
		}
		err = c.Errorf("%v completion: %w", wrName(wc.WRID), wc.Status)
		if wc.Status != verbs.WCWRFlushErr || c.state != ConnFailed {
			e.Fail(c, err)
		}
	}
	switch wc.WRID & WRKind {
	case WRSend:
		if idx != NoSlot {
			e.Core.Send.Put(uint32(idx))
		}
	case WRCredit:
	case WRRead:
		c.readsOut--
		if !e.Core.Reads.Completed(idx, err) {
			e.m.Bad.Inc()
		}
	default:
		e.m.Bad.Inc()
	}
	e.MarkDirty(c)
	return 0
}

// received handles the completion of receive buffer i. The completion
// names the QP the frame came through (RC: the sender's QP toward this
// rank; XRC: the TGT QP of its INI QP), and so the sender.
func (e *Endpoint) received(h transport.Handler, wc *verbs.WorkCompletion, i uint32) int {
	recv := e.Core.Recv
	if int(i) >= recv.N {
		e.m.Bad.Inc()
		return 0
	}
	defer recv.Put(i)
	if wc.Status != verbs.WCSuccess {
		// A receive fails when its QP fails (RC: the QP's error
		// completes the peer's sends too) or the SRQ is torn down.
		e.m.CompletionErrors.Inc()
		return 0
	}
	p := e.byRecv[wc.QPNum]
	if p == nil || wc.Flags&verbs.WCWithImm == 0 || int(wc.ByteLen) > recv.Size {
		e.m.Bad.Inc()
		e.log.Warn("dropped a receive", e.recvKey, wc.QPNum, "bytes", wc.ByteLen, "flags", wc.Flags)
		return 0
	}
	if p.reported {
		// Reported failed (report): the handler hears nothing more of p.
		e.m.FailedPeerFrames.Inc()
		e.log.Debug("dropped a frame of a failed peer", "peer", p.Rank, "bytes", wc.ByteLen)
		return 0
	}
	if !p.cr.Received(wc.Imm) {
		e.m.CreditMsgsIn.Inc()
		return 0
	}
	e.markPeer(p)
	e.m.RecvFrames.Inc()
	e.m.RecvBytes.Add(float64(wc.ByteLen))
	h.Deliver(p.Rank, recv.Buf(i)[:wc.ByteLen])
	return 1
}

// MarkDirty has Progress post c's waiting reads, if any.
func (e *Endpoint) MarkDirty(c *Conn) {
	if len(c.pending) > 0 && !c.dirty {
		c.dirty = true
		e.dirtyConns = append(e.dirtyConns, c)
	}
}

// markPeer has Progress return p's credits once enough are owed.
func (e *Endpoint) markPeer(p *Peer) {
	if !p.dirty {
		p.dirty = true
		e.dirtyPeers = append(e.dirtyPeers, p)
	}
}
