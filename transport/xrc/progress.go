package xrc

import (
	"fmt"

	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/verbs"
)

// Progress polls the CQ: it delivers received frames to h (in the order
// each rank sent them: one INI QP per sender and node, in order), takes
// credits back, frees send buffers and send queue entries, finishes reads
// (ReadDone), then reposts receive buffers, posts waiting reads and
// returns credits. With lazy connection it first applies what the
// bootstrap goroutines learned. The handler may call TrySend and Read. It
// returns how many frames and reads it delivered.
func (t *Transport) Progress(h transport.Handler) (int, error) {
	if t.closed {
		return 0, fmt.Errorf("xrc: progress after close")
	}
	n := 0
	if t.lz != nil {
		t.lz.apply()
	}
	n += t.core.Reads.Finish(h)
	k, err := t.core.Poll(func(wc *verbs.WorkCompletion) int { return t.complete(h, wc) }, t.m.Metrics)
	n += k
	if err != nil {
		return n, fmt.Errorf("xrc: %w", err)
	}
	keep := t.dirty[:0]
	for _, nd := range t.dirty {
		t.postReads(nd)
		if nd.state != connFailed && len(nd.pending) > 0 {
			keep = append(keep, nd)
		} else {
			nd.dirty = false
		}
	}
	clear(t.dirty[len(keep):])
	t.dirty = keep
	owe := t.dirtyPeers[:0]
	for _, p := range t.dirtyPeers {
		if t.returnCredits(p) {
			owe = append(owe, p)
		} else {
			p.dirty = false
		}
	}
	clear(t.dirtyPeers[len(owe):])
	t.dirtyPeers = owe
	n += t.core.Reads.Finish(h)
	return n, nil
}

// complete handles one completion and returns 1 if it delivered a frame.
func (t *Transport) complete(h transport.Handler, wc *verbs.WorkCompletion) int {
	idx := wc.WRID &^ wrKind
	if wc.WRID&wrKind == wrRecv {
		return t.received(h, wc, uint32(idx))
	}
	n := t.byINI[wc.QPNum]
	if n == nil {
		t.m.Bad.Inc()
		t.log.Warn("completion of an unknown QP", "qpn", wc.QPNum, "wr_id", wc.WRID, "status", wc.Status)
		return 0
	}
	n.sqUsed--
	var err error
	if wc.Status != verbs.WCSuccess {
		t.m.CompletionErrors.Inc()
		if wc.Status == verbs.WCRNRRetryExcErr {
			t.m.RNRExceeded.Inc()
		}
		err = nodeError(n, "%v completion: %v", wrName(wc.WRID), wc.Status)
		if wc.Status != verbs.WCWRFlushErr || n.state != connFailed {
			t.fail(n, err)
		}
	}
	switch wc.WRID & wrKind {
	case wrSend:
		if idx != noSlot {
			t.core.Send.Put(uint32(idx))
		}
	case wrCredit:
	case wrRead:
		n.readsOut--
		if !t.core.Reads.Completed(idx, err) {
			t.m.Bad.Inc()
		}
	default:
		t.m.Bad.Inc()
	}
	if len(n.pending) > 0 {
		t.markDirty(n)
	}
	return 0
}

// received handles the completion of receive buffer i. The completion
// names the TGT QP the frame came through, and so its sender.
func (t *Transport) received(h transport.Handler, wc *verbs.WorkCompletion, i uint32) int {
	recv := t.core.Recv
	if int(i) >= recv.N {
		t.m.Bad.Inc()
		return 0
	}
	defer recv.Put(i)
	if wc.Status != verbs.WCSuccess {
		// A receive fails when the SRQ is torn down or fails.
		t.m.CompletionErrors.Inc()
		return 0
	}
	p := t.byTgt[wc.QPNum]
	if p == nil || wc.Flags&verbs.WCWithImm == 0 || int(wc.ByteLen) > recv.Size {
		t.m.Bad.Inc()
		t.log.Warn("dropped a receive", "tgt_qpn", wc.QPNum, "bytes", wc.ByteLen, "flags", wc.Flags)
		return 0
	}
	if !p.cr.Received(wc.Imm) {
		t.m.CreditMsgsIn.Inc()
		return 0
	}
	if !p.dirty {
		p.dirty = true
		t.dirtyPeers = append(t.dirtyPeers, p)
	}
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
