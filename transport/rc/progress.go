package rc

import (
	"fmt"

	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/verbs"
)

// pollRounds bounds the CQ polls of one Progress, so that a flood of
// completions does not keep the caller from its other transports.
const pollRounds = 8

// Progress polls the CQ: it delivers received frames to h (in the order
// each peer sent them: one QP per peer, in order), takes credits back,
// frees send buffers, finishes reads (ReadDone), then reposts receive
// buffers, posts waiting reads and returns credits. The handler may call
// TrySend and Read. It returns how many frames and reads it delivered.
func (t *Transport) Progress(h transport.Handler) (int, error) {
	if t.closed {
		return 0, fmt.Errorf("rc: progress after close")
	}
	n := 0
	if t.lz != nil {
		t.lz.apply()
	}
	n += t.finishReads(h)
	for range pollRounds {
		k, err := t.cq.Poll(t.wc)
		if err != nil {
			return n, fmt.Errorf("rc: poll CQ: %w", err)
		}
		for i := range k {
			n += t.complete(h, &t.wc[i])
		}
		if k < len(t.wc) {
			break
		}
	}
	posted, err := t.recv.refill()
	t.m.srqPosted.Set(float64(posted))
	if err != nil {
		return n, err
	}
	if posted > t.recv.limit() && t.recv.fired.Swap(false) {
		if err := t.recv.arm(); err != nil {
			return n, err
		}
	}
	// Handlers may add peers to the list while it is walked.
	for i := 0; i < len(t.dirty); i++ {
		p := t.dirty[i]
		t.postReads(p)
		t.returnCredits(p)
	}
	keep := t.dirty[:0]
	for _, p := range t.dirty {
		if p.state != peerFailed && (len(p.pending) > 0 || (p.state == peerReady && (p.freed-p.announced)&creditMask >= t.refund)) {
			keep = append(keep, p)
		} else {
			p.dirty = false
		}
	}
	clear(t.dirty[len(keep):])
	t.dirty = keep
	n += t.finishReads(h)
	return n, nil
}

func (t *Transport) finishReads(h transport.Handler) int {
	n := 0
	for len(t.done) > 0 {
		done := t.done
		t.done = nil
		for _, d := range done {
			h.ReadDone(d.cookie, d.err)
			n++
		}
	}
	return n
}

// complete handles one completion and returns 1 if it delivered a frame.
func (t *Transport) complete(h transport.Handler, wc *verbs.WorkCompletion) int {
	idx := wc.WRID &^ wrKind
	if wc.WRID&wrKind == wrRecv {
		return t.received(h, wc, uint32(idx))
	}
	p := t.byQPN[wc.QPNum]
	if p == nil {
		t.m.bad.Inc()
		t.log.Warn("completion of an unknown QP", "qpn", wc.QPNum, "wr_id", wc.WRID, "status", wc.Status)
		return 0
	}
	p.sqUsed--
	var err error
	if wc.Status != verbs.WCSuccess {
		t.m.completionErrors.Inc()
		if wc.Status == verbs.WCRNRRetryExcErr {
			t.m.rnrExceeded.Inc()
		}
		err = peerError(p, "%v completion: %v", wrName(wc.WRID), wc.Status)
		if wc.Status != verbs.WCWRFlushErr || p.state != peerFailed {
			t.fail(p, err)
		}
	}
	switch wc.WRID & wrKind {
	case wrSend:
		if idx != noSlot {
			t.send.put(uint32(idx))
		}
	case wrCredit:
	case wrRead:
		p.readsOut--
		if op := t.reads[idx]; op != nil {
			t.chunkDone(op, err)
		} else {
			t.m.bad.Inc()
		}
	default:
		t.m.bad.Inc()
	}
	if len(p.pending) > 0 {
		t.markDirty(p)
	}
	return 0
}

// received handles the completion of receive buffer i.
func (t *Transport) received(h transport.Handler, wc *verbs.WorkCompletion, i uint32) int {
	if int(i) >= t.recv.n {
		t.m.bad.Inc()
		return 0
	}
	defer t.recv.put(i)
	if wc.Status != verbs.WCSuccess {
		// A receive fails when its QP fails (the QP's error completes
		// the peer's sends too) or the SRQ is torn down.
		t.m.completionErrors.Inc()
		return 0
	}
	p := t.byQPN[wc.QPNum]
	if p == nil || wc.Flags&verbs.WCWithImm == 0 || int(wc.ByteLen) > t.recv.size {
		t.m.bad.Inc()
		t.log.Warn("dropped a receive", "qpn", wc.QPNum, "bytes", wc.ByteLen, "flags", wc.Flags)
		return 0
	}
	p.peerFreed = wc.Imm & creditMask
	if wc.Imm&creditOnly != 0 {
		t.m.creditMsgsIn.Inc()
		return 0
	}
	p.freed++
	t.markDirty(p)
	t.m.recvFrames.Inc()
	t.m.recvBytes.Add(float64(wc.ByteLen))
	h.Deliver(p.rank, t.recv.buf(i)[:wc.ByteLen])
	return 1
}

func wrName(id uint64) string {
	switch id & wrKind {
	case wrSend:
		return "send"
	case wrCredit:
		return "credit"
	case wrRead:
		return "RDMA READ"
	}
	return "unknown"
}
