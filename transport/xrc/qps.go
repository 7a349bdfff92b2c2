package xrc

import (
	"errors"
	"fmt"
	"time"

	"github.com/xrcrun/xrc/transport/internal/verbsx"
	"github.com/xrcrun/xrc/verbs"
)

// createINI makes n's INI QP and takes it to INIT.
func (t *Transport) createINI(n *node) error {
	if err := t.e.MakeQP(&n.ini, verbs.QPInitAttr{Type: verbs.QPTXRCIni, SendCQ: t.e.Core.CQ}); err != nil {
		return n.ini.Errorf("INI QP: %w", err)
	}
	return nil
}

// connectINI takes n's INI QP from INIT to RTS toward the TGT QP tgt of
// the node, whose port has gid and MTU mtu.
func (t *Transport) connectINI(n *node, tgt uint32, gid verbs.GID, mtu verbs.MTU) error {
	// The INI QP receives nothing: its RTR PSN is its own.
	to := verbsx.Dest{GID: gid, MTU: mtu, QPN: tgt, PSN: n.ini.PSN}
	if err := t.e.BringUp(&n.ini, to, false); err != nil {
		return n.ini.Errorf("connect INI QP to TGT QP %#x: %w", tgt, err)
	}
	n.tgt = tgt
	return nil
}

// createTGT creates, in the node's domain, the TGT QP for the INI QP of
// rank toward this node, and takes it to INIT.
func (t *Transport) createTGT(rank int) (*tgt, error) {
	if t.tgts[rank] != nil {
		return nil, fmt.Errorf("xrc: a second TGT QP for rank %d", rank)
	}
	defer t.e.Timed(time.Now())
	qp, err := t.xrcd.CreateTgtQP()
	if err == nil && t.failTGT != nil {
		err = errors.Join(t.failTGT, qp.Close())
	}
	if err != nil {
		return nil, fmt.Errorf("xrc: TGT QP for rank %d: %w", rank, err)
	}
	if err := t.e.Core.ToInit(qp); err != nil {
		return nil, errors.Join(fmt.Errorf("xrc: TGT QP for rank %d: %w", rank, err), qp.Close())
	}
	g := &tgt{qp: qp, created: true}
	t.tgts[rank] = g
	t.m.tgtCreated.Inc()
	return g, nil
}

// connectTGT takes a TGT QP this rank created from INIT to RTR toward the
// INI QP ini (first PSN psn) of rank p.
func (t *Transport) connectTGT(g *tgt, p *peer, ini, psn uint32) error {
	defer t.e.Timed(time.Now())
	to := verbsx.Dest{GID: p.rec.gid, MTU: p.rec.mtu, QPN: ini, PSN: psn}
	if err := t.e.Core.ToRTR(g.qp, to, true); err != nil {
		return fmt.Errorf("xrc: connect TGT QP %#x to rank %d's INI QP %#x: %w", g.qp.Num(), p.Rank, ini, err)
	}
	t.m.Connects.Inc()
	t.learnTGT(g, p)
	return nil
}

// openTGT opens the TGT QP num, which another rank of the node created
// for the INI QP of p, and learns it.
func (t *Transport) openTGT(p *peer, num uint32) error {
	if t.tgts[p.Rank] != nil {
		return fmt.Errorf("xrc: a second TGT QP for rank %d", p.Rank)
	}
	defer t.e.Timed(time.Now())
	qp, err := t.xrcd.OpenQP(num)
	if err != nil {
		return fmt.Errorf("xrc: open the TGT QP %#x of rank %d: %w", num, p.Rank, err)
	}
	g := &tgt{qp: qp}
	t.tgts[p.Rank] = g
	t.m.tgtOpened.Inc()
	t.learnTGT(g, p)
	return nil
}

// learnTGT records that frames arriving on g come from p.
func (t *Transport) learnTGT(g *tgt, p *peer) {
	t.e.Receives(g.qp.Num(), &p.Peer)
	p.known = true
}
