package rc

import (
	"fmt"

	"github.com/xrcrun/xrc/transport/internal/verbsx"
	"github.com/xrcrun/xrc/verbs"
)

// Work request ids: the kind in the top byte, an index below.
const (
	wrRecv   uint64 = 1 << 56 // index: the receive buffer
	wrSend   uint64 = 2 << 56 // index: the send slot, or noSlot (inline)
	wrCredit uint64 = 3 << 56 // a credit message
	wrRead   uint64 = 4 << 56 // index: the read operation
	wrKind   uint64 = 0xff << 56
	noSlot          = verbsx.NoSlot
)

// TrySend sends one frame (the parts, concatenated) to rank as a
// SEND_WITH_IMM. It returns false when the peer has no buffer for it by
// this rank's credits, the QP's send queue is full, no send buffer is free
// or the QP is still connecting. Frames up to the inline size are copied
// into the work request; larger ones into a registered send buffer. The
// parts are free when TrySend returns.
func (t *Transport) TrySend(rank int, parts ...[]byte) (bool, error) {
	p, err := t.peer(rank)
	if err != nil {
		return false, err
	}
	total := 0
	for _, b := range parts {
		total += len(b)
	}
	if total > t.cfg.EagerSize {
		return false, fmt.Errorf("rc: frame of %d bytes to rank %d: at most %d", total, rank, t.cfg.EagerSize)
	}
	if ok, err := t.ready(p); !ok {
		return false, err
	}
	if p.cr.Outstanding() >= t.credits {
		t.m.CreditStalls.Inc()
		return false, nil
	}
	// One send queue entry stays free for a credit message.
	if p.sqUsed >= t.cfg.SendDepth-1 {
		t.m.QueueStalls.Inc()
		return false, nil
	}
	wr := verbs.SendWR{Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled, Imm: p.cr.SendImm()}
	var sges [8]verbs.SGE
	slot, ok := t.core.Frame(&wr, sges[:], t.inline, parts, total)
	if !ok {
		t.m.QueueStalls.Inc()
		return false, nil
	}
	wr.WRID = wrSend | uint64(slot)
	if err := p.qp.PostSend(&wr); err != nil {
		if slot != noSlot {
			t.core.Send.Put(slot)
		}
		err = peerError(p, "send: %w", err)
		t.fail(p, err)
		return false, err
	}
	p.sqUsed++
	p.cr.Sent()
	t.m.SentFrames.Inc()
	t.m.SentBytes.Add(float64(total))
	return true, nil
}

// ready reports whether p's QP can take work now, starting a lazy
// connection if it has none, and p's error if it failed.
func (t *Transport) ready(p *peer) (bool, error) {
	switch p.state {
	case peerReady:
		return true, nil
	case peerFailed:
		return false, p.err
	case peerIdle:
		if t.lz == nil {
			return false, peerError(p, "not connected")
		}
		if err := t.lz.start(p); err != nil {
			return false, err
		}
	}
	return false, nil
}

// returnCredits sends p a credit message if this rank consumed enough of
// its frames since it last said so. Called by Progress for dirty peers.
func (t *Transport) returnCredits(p *peer) {
	if p.state != peerReady || p.cr.Owed() < t.refund || p.sqUsed >= t.cfg.SendDepth {
		return
	}
	wr := verbs.SendWR{WRID: wrCredit, Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled | verbs.SendInline,
		Imm: p.cr.CreditImm()}
	if err := p.qp.PostSend(&wr); err != nil {
		t.fail(p, peerError(p, "credit message: %w", err))
		return
	}
	p.sqUsed++
	p.cr.Announced()
	t.m.CreditMsgs.Inc()
}
