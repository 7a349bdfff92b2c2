package verbsx

import (
	"math/rand/v2"
	"time"

	"github.com/xrcrun/xrc/verbs"
)

// MakeQP makes c's QP from attr, with the Endpoint's send queue, and
// takes it to INIT; c's completions are c's from now on. The transport
// sets c.State. The error is the device's, for the transport to wrap.
func (e *Endpoint) MakeQP(c *Conn, attr verbs.QPInitAttr) error {
	start := time.Now()
	c.Started = start
	defer e.Timed(start)
	attr.Cap = verbs.QPCap{MaxSendWR: uint32(e.sendDepth), MaxSendSGE: 2, MaxInlineData: InlineSize}
	qp, err := e.Core.PD.CreateQP(&attr)
	if err != nil {
		return err
	}
	c.QP, c.PSN = qp, rand.Uint32N(1<<24)
	e.conns = append(e.conns, c)
	e.bySend[qp.Num()] = c
	e.qps.Inc()
	if e.inline == 0 {
		e.inline = int(min(InlineSize, qp.Cap().MaxInlineData))
	}
	return e.Core.ToInit(qp)
}

// Receives records that the receive completions naming QP qpn (RC: p's
// QP; XRC: the TGT QP of p's INI QP) are p's frames.
func (e *Endpoint) Receives(qpn uint32, p *Peer) { e.byRecv[qpn] = p }

// BringUp takes c's QP from INIT to RTS toward to, as a responder (RC)
// or not (XRC's INI QP), and marks c ready. The error is the device's.
func (e *Endpoint) BringUp(c *Conn, to Dest, responder bool) error {
	defer e.Timed(time.Now())
	err := e.Core.ToRTR(c.QP, to, responder)
	if err == nil {
		err = e.Core.ToRTS(c.QP, c.PSN)
	}
	if err != nil {
		return err
	}
	c.State = ConnReady
	e.m.Connects.Inc()
	if e.Lazy != nil {
		e.handshake += time.Since(c.Started)
	}
	return nil
}

// Timed adds the time since start to the setup time of Usage.
func (e *Endpoint) Timed(start time.Time) { e.setup += time.Since(start) }

// Fail marks c failed with err (which names whom c reaches): every later
// call toward its peers returns err, and its queued reads end with it.
func (e *Endpoint) Fail(c *Conn, err error) {
	if c.State == ConnFailed {
		return
	}
	ranks := 0
	for _, p := range e.peers {
		if p != nil && p.Conn == c {
			ranks++
		}
	}
	if c.node {
		e.log.Error("node failed", "node", c.id, "err", err)
	} else {
		e.log.Error("peer failed", "peer", c.id, "err", err)
	}
	e.m.PeerErrors.Add(float64(ranks))
	c.State, c.Err = ConnFailed, err
	e.Core.Reads.Fail(c.Pending, err)
	c.Pending = nil
}

// MarkDirty has Progress post c's waiting reads, if any.
func (e *Endpoint) MarkDirty(c *Conn) {
	if len(c.Pending) > 0 && !c.dirty {
		c.dirty = true
		e.dirtyC = append(e.dirtyC, c)
	}
}

func (e *Endpoint) markPeer(p *Peer) {
	if !p.dirty {
		p.dirty = true
		e.dirtyP = append(e.dirtyP, p)
	}
}
