package verbsx

import (
	"math/rand/v2"
	"time"

	"github.com/xrcrun/xrc/verbs"
)

// MakeQP makes c's QP from attr, with the Endpoint's send queue, and
// takes it to INIT; c's completions are c's from now on. c is then
// ConnConnecting, until BringUp. The error is the device's, for the
// transport to wrap.
func (e *Endpoint) MakeQP(c *Conn, attr verbs.QPInitAttr) error {
	start := time.Now()
	c.started = start
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
	if err := e.Core.ToInit(qp); err != nil {
		return err
	}
	c.state = ConnConnecting
	return nil
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
	c.state = ConnReady
	e.m.Connects.Inc()
	if e.Lazy != nil {
		e.handshake += time.Since(c.started)
	}
	return nil
}

// Timed adds the time since start to the setup time of Usage.
func (e *Endpoint) Timed(start time.Time) { e.setup += time.Since(start) }
