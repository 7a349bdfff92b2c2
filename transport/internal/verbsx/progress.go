package verbsx

import (
	"fmt"

	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/verbs"
)

// Progress applies what the lazy connector learned, then polls the CQ: it
// delivers received frames to h (in the order each rank sent them: one
// QP per sender, in order), takes credits back, frees send buffers and
// send queue entries, finishes reads (ReadDone), then reposts receive
// buffers, posts waiting reads and returns credits. The handler may call
// TrySend and Read. It returns how many frames and reads it delivered.
func (e *Endpoint) Progress(h transport.Handler) (int, error) {
	if e.stopped {
		return 0, e.errClosed("progress")
	}
	if e.Lazy != nil {
		e.Lazy.Apply()
	}
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
	return n, nil
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
		err = c.Errorf("%v completion: %v", wrName(wc.WRID), wc.Status)
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
