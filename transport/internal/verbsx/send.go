package verbsx

import (
	"fmt"

	"github.com/xrcrun/xrc/verbs"
)

// TrySend sends one frame (the parts, concatenated) to rank as a
// SEND_WITH_IMM on its Conn, naming its SRQ (XRC), with the credits it
// is owed in the immediate data. It returns false when rank has no buffer
// for it by this rank's credits, the Conn's send queue is full (one entry
// is kept for credit messages), no send buffer is free or the Conn is not
// connected yet (starting a lazy connection). Frames up to the inline
// size are copied into the work request; larger ones into a registered
// send buffer. The parts are free when TrySend returns.
func (e *Endpoint) TrySend(rank int, parts ...[]byte) (bool, error) {
	if e.stopped {
		return false, e.errClosed("send")
	}
	p, err := e.Peer(rank)
	if err != nil {
		return false, err
	}
	total := 0
	for _, b := range parts {
		total += len(b)
	}
	if total > e.eager {
		return false, fmt.Errorf("%s: frame of %d bytes to rank %d: at most %d", e.name, total, rank, e.eager)
	}
	if ok, err := e.ready(p); !ok {
		return false, err
	}
	if p.cr.Outstanding() >= p.credits {
		e.m.CreditStalls.Inc()
		return false, nil
	}
	c := p.Conn
	if c.sqUsed >= e.sendDepth-1 {
		e.m.QueueStalls.Inc()
		return false, nil
	}
	wr := verbs.SendWR{Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled, Imm: p.cr.SendImm(), RemoteSRQNum: p.SRQN}
	var sges [8]verbs.SGE
	slot, ok := e.Core.Frame(&wr, sges[:], e.inline, parts, total)
	if !ok {
		e.m.QueueStalls.Inc()
		return false, nil
	}
	wr.WRID = WRSend | uint64(slot)
	if err := c.QP.PostSend(&wr); err != nil {
		if slot != NoSlot {
			e.Core.Send.Put(slot)
		}
		err = c.postError(p, "send", err)
		e.Fail(c, err)
		return false, err
	}
	c.sqUsed++
	p.cr.Sent()
	e.m.SentFrames.Inc()
	e.m.SentBytes.Add(float64(total))
	return true, nil
}

// ready reports whether frames may go to p now, starting a lazy
// connection if there is none, and the error of p's Conn if it failed.
func (e *Endpoint) ready(p *Peer) (bool, error) {
	switch {
	case p.err != nil: // its Conn's, if that failed (Fail)
		return false, p.err
	case p.Ready():
		return true, nil
	}
	return false, e.connect(p)
}

// connect starts a lazy connection toward p. Without lazy connection a
// peer not ready is not connected: the error names p's Conn (RC: p; XRC:
// p's node), which Read fails with it.
func (e *Endpoint) connect(p *Peer) error {
	if e.Lazy == nil {
		return p.Conn.Errorf("not connected")
	}
	return e.Lazy.Start(p)
}

// returnCredits sends p a credit message if this rank consumed enough of
// its frames since it last said so. Called by Progress for dirty peers;
// reports whether p still owes.
func (e *Endpoint) returnCredits(p *Peer) bool {
	if p.cr.Owed() < e.refund || p.err != nil {
		return false
	}
	c := p.Conn
	if !p.Ready() || c.sqUsed >= e.sendDepth {
		return c.state != ConnFailed
	}
	wr := verbs.SendWR{WRID: WRCredit, Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled | verbs.SendInline,
		Imm: p.cr.CreditImm(), RemoteSRQNum: p.SRQN}
	if err := c.QP.PostSend(&wr); err != nil {
		e.Fail(c, c.postError(p, "credit message", err))
		return false
	}
	c.sqUsed++
	p.cr.Announced()
	e.m.CreditMsgs.Inc()
	return false
}
