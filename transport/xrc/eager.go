package xrc

import (
	"fmt"

	"github.com/xrcrun/xrc/transport/internal/verbsx"
	"github.com/xrcrun/xrc/verbs"
)

// TrySend sends one frame (the parts, concatenated) to rank as a
// SEND_WITH_IMM on the INI QP toward its node, naming its SRQ. It returns
// false when the rank has no buffer for it by this rank's credits, the
// INI QP's send queue is full (its entries are shared by every rank of the
// node, one kept free for credit messages), no send buffer is free or the
// connection is still being made. Frames up to the inline size are copied
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
		return false, fmt.Errorf("xrc: frame of %d bytes to rank %d: at most %d", total, rank, t.cfg.EagerSize)
	}
	if ok, err := t.ready(p); !ok {
		return false, err
	}
	if p.cr.Outstanding() >= t.credits {
		t.m.CreditStalls.Inc()
		return false, nil
	}
	n := p.node
	if n.sqUsed >= t.cfg.SendDepth-1 {
		t.m.QueueStalls.Inc()
		return false, nil
	}
	wr := verbs.SendWR{Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled, Imm: p.cr.SendImm(), RemoteSRQNum: p.srqn}
	var sges [8]verbs.SGE
	slot, ok := t.core.Frame(&wr, sges[:], t.inline, parts, total)
	if !ok {
		t.m.QueueStalls.Inc()
		return false, nil
	}
	wr.WRID = wrSend | uint64(slot)
	if err := n.ini.PostSend(&wr); err != nil {
		if slot != verbsx.NoSlot {
			t.core.Send.Put(slot)
		}
		err = nodeError(n, "send to rank %d: %w", rank, err)
		t.fail(n, err)
		return false, err
	}
	n.sqUsed++
	p.cr.Sent()
	t.m.SentFrames.Inc()
	t.m.SentBytes.Add(float64(total))
	return true, nil
}

// ready reports whether frames may go to p now, starting a lazy
// connection if there is none, and the error of p's node if it failed.
func (t *Transport) ready(p *peer) (bool, error) {
	switch {
	case p.node.state == connFailed:
		return false, p.node.err
	case p.ready():
		return true, nil
	case t.lz == nil:
		return false, fmt.Errorf("xrc: rank %d: not connected", p.rank)
	}
	return false, t.lz.start(p)
}

// returnCredits sends p a credit message if this rank consumed enough of
// its frames since it last said so. Called by Progress for dirty peers;
// reports whether p still owes.
func (t *Transport) returnCredits(p *peer) bool {
	if p.cr.Owed() < t.refund {
		return false
	}
	n := p.node
	if !p.ready() || n.sqUsed >= t.cfg.SendDepth {
		return n.state != connFailed
	}
	wr := verbs.SendWR{WRID: wrCredit, Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled | verbs.SendInline,
		Imm: p.cr.CreditImm(), RemoteSRQNum: p.srqn}
	if err := n.ini.PostSend(&wr); err != nil {
		t.fail(n, nodeError(n, "credit message to rank %d: %w", p.rank, err))
		return false
	}
	n.sqUsed++
	p.cr.Announced()
	t.m.CreditMsgs.Inc()
	return false
}
