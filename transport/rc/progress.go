package rc

import (
	"fmt"

	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/verbs"
)

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
	n += t.core.Reads.Finish(h)
	k, err := t.core.Poll(func(wc *verbs.WorkCompletion) int { return t.complete(h, wc) }, t.m.Metrics)
	n += k
	if err != nil {
		return n, fmt.Errorf("rc: %w", err)
	}
	// Handlers may add peers to the list while it is walked.
	for i := 0; i < len(t.dirty); i++ {
		p := t.dirty[i]
		t.postReads(p)
		t.returnCredits(p)
	}
	keep := t.dirty[:0]
	for _, p := range t.dirty {
		if p.state != peerFailed && (len(p.pending) > 0 || (p.state == peerReady && p.cr.Owed() >= t.refund)) {
			keep = append(keep, p)
		} else {
			p.dirty = false
		}
	}
	clear(t.dirty[len(keep):])
	t.dirty = keep
	n += t.core.Reads.Finish(h)
	return n, nil
}

// complete handles one completion and returns 1 if it delivered a frame.
func (t *Transport) complete(h transport.Handler, wc *verbs.WorkCompletion) int {
	idx := wc.WRID &^ wrKind
	if wc.WRID&wrKind == wrRecv {
		return t.received(h, wc, uint32(idx))
	}
	p := t.byQPN[wc.QPNum]
	if p == nil {
		t.m.Bad.Inc()
		t.log.Warn("completion of an unknown QP", "qpn", wc.QPNum, "wr_id", wc.WRID, "status", wc.Status)
		return 0
	}
	p.sqUsed--
	var err error
	if wc.Status != verbs.WCSuccess {
		t.m.CompletionErrors.Inc()
		if wc.Status == verbs.WCRNRRetryExcErr {
			t.m.RNRExceeded.Inc()
		}
		err = peerError(p, "%v completion: %v", wrName(wc.WRID), wc.Status)
		if wc.Status != verbs.WCWRFlushErr || p.state != peerFailed {
			t.fail(p, err)
		}
	}
	switch wc.WRID & wrKind {
	case wrSend:
		if idx != noSlot {
			t.core.Send.Put(uint32(idx))
		}
	case wrCredit:
	case wrRead:
		p.readsOut--
		if !t.core.Reads.Completed(idx, err) {
			t.m.Bad.Inc()
		}
	default:
		t.m.Bad.Inc()
	}
	if len(p.pending) > 0 {
		t.markDirty(p)
	}
	return 0
}

// received handles the completion of receive buffer i.
func (t *Transport) received(h transport.Handler, wc *verbs.WorkCompletion, i uint32) int {
	recv := t.core.Recv
	if int(i) >= recv.N {
		t.m.Bad.Inc()
		return 0
	}
	defer recv.Put(i)
	if wc.Status != verbs.WCSuccess {
		// A receive fails when its QP fails (the QP's error completes
		// the peer's sends too) or the SRQ is torn down.
		t.m.CompletionErrors.Inc()
		return 0
	}
	p := t.byQPN[wc.QPNum]
	if p == nil || wc.Flags&verbs.WCWithImm == 0 || int(wc.ByteLen) > recv.Size {
		t.m.Bad.Inc()
		t.log.Warn("dropped a receive", "qpn", wc.QPNum, "bytes", wc.ByteLen, "flags", wc.Flags)
		return 0
	}
	if !p.cr.Received(wc.Imm) {
		t.m.CreditMsgsIn.Inc()
		return 0
	}
	t.markDirty(p)
	t.m.RecvFrames.Inc()
	t.m.RecvBytes.Add(float64(wc.ByteLen))
	h.Deliver(p.rank, recv.Buf(i)[:wc.ByteLen])
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
