package xrc

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/xrcrun/xrc/verbs"
)

// Tunables of the QPs.
const (
	inlineSize  = 96 // frames up to this size go inline
	minRNRTimer = 12 // 0.64 ms
	rnrRetry    = 7  // retry forever: RNR is flow control's last resort
	qpTimeout   = 14 // 67 ms
	retryCount  = 7  // transport retries before a QP fails
)

func (t *Transport) timed(start time.Time) { t.setupTime += time.Since(start) }

// av is the address of the port whose GID is gid.
func (t *Transport) av(gid verbs.GID) verbs.AHAttr {
	return verbs.AHAttr{IsGlobal: true, Port: t.cfg.Port, GRH: verbs.GlobalRoute{DGID: gid, HopLimit: 64}}
}

// createINI makes n's INI QP and takes it to INIT.
func (t *Transport) createINI(n *node) error {
	start := time.Now()
	n.started = start
	defer t.timed(start)
	qp, err := t.core.PD.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTXRCIni, SendCQ: t.core.CQ,
		Cap: verbs.QPCap{MaxSendWR: uint32(t.cfg.SendDepth), MaxSendSGE: 2, MaxInlineData: inlineSize}})
	if err != nil {
		return nodeError(n, "INI QP: %w", err)
	}
	n.ini, n.psn, n.state = qp, rand.Uint32N(1<<24), connConnecting
	t.byINI[qp.Num()] = n
	t.m.iniQPs.Inc()
	if t.inline == 0 {
		t.inline = int(min(inlineSize, qp.Cap().MaxInlineData))
	}
	err = qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: t.cfg.Port, AccessFlags: verbs.AccessRemoteRead},
		verbs.QPAttrState|verbs.QPAttrPkeyIndex|verbs.QPAttrPort|verbs.QPAttrAccessFlags)
	if err != nil {
		return nodeError(n, "INI QP: %w", err)
	}
	return nil
}

// connectINI takes n's INI QP from INIT to RTS toward the TGT QP tgt of
// the node, whose port has gid and MTU mtu.
func (t *Transport) connectINI(n *node, tgt uint32, gid verbs.GID, mtu verbs.MTU) error {
	start := time.Now()
	defer t.timed(start)
	err := n.ini.Modify(&verbs.QPAttr{State: verbs.QPSRTR, PathMTU: min(t.core.Port.ActiveMTU, mtu), DestQPN: tgt,
		RQPSN: n.psn, AH: t.av(gid)},
		verbs.QPAttrState|verbs.QPAttrAV|verbs.QPAttrPathMTU|verbs.QPAttrDestQPN|verbs.QPAttrRQPSN)
	if err == nil {
		err = n.ini.Modify(&verbs.QPAttr{State: verbs.QPSRTS, Timeout: qpTimeout, RetryCnt: retryCount,
			RNRRetry: rnrRetry, SQPSN: n.psn, MaxRdAtomic: uint8(t.core.MaxRd)},
			verbs.QPAttrState|verbs.QPAttrTimeout|verbs.QPAttrRetryCnt|verbs.QPAttrRNRRetry|
				verbs.QPAttrSQPSN|verbs.QPAttrMaxQPRdAtomic)
	}
	if err != nil {
		return nodeError(n, "connect INI QP to TGT QP %#x: %w", tgt, err)
	}
	n.tgt, n.state = tgt, connReady
	t.m.Connects.Inc()
	if t.lz != nil {
		t.handshake += time.Since(n.started)
	}
	return nil
}

// createTGT creates, in the node's domain, the TGT QP for the INI QP of
// rank toward this node, and takes it to INIT.
func (t *Transport) createTGT(rank int) (*tgt, error) {
	start := time.Now()
	defer t.timed(start)
	qp, err := t.xrcd.CreateTgtQP()
	if err != nil {
		return nil, fmt.Errorf("xrc: TGT QP for rank %d: %w", rank, err)
	}
	err = qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: t.cfg.Port, AccessFlags: verbs.AccessRemoteRead},
		verbs.QPAttrState|verbs.QPAttrPkeyIndex|verbs.QPAttrPort|verbs.QPAttrAccessFlags)
	if err != nil {
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
	start := time.Now()
	defer t.timed(start)
	err := g.qp.Modify(&verbs.QPAttr{State: verbs.QPSRTR, PathMTU: min(t.core.Port.ActiveMTU, p.rec.mtu), DestQPN: ini,
		RQPSN: psn, MaxDestRdAtomic: uint8(t.core.MaxRd), MinRNRTimer: minRNRTimer, AH: t.av(p.rec.gid)},
		verbs.QPAttrState|verbs.QPAttrAV|verbs.QPAttrPathMTU|verbs.QPAttrDestQPN|verbs.QPAttrRQPSN|
			verbs.QPAttrMaxDestRdAtomic|verbs.QPAttrMinRNRTimer)
	if err != nil {
		return fmt.Errorf("xrc: connect TGT QP %#x to rank %d's INI QP %#x: %w", g.qp.Num(), p.rank, ini, err)
	}
	t.m.Connects.Inc()
	t.learnTGT(g, p)
	return nil
}

// openTGT opens the TGT QP num, which another rank of the node created
// for the INI QP of p, and learns it.
func (t *Transport) openTGT(p *peer, num uint32) error {
	start := time.Now()
	defer t.timed(start)
	qp, err := t.xrcd.OpenQP(num)
	if err != nil {
		return fmt.Errorf("xrc: open the TGT QP %#x of rank %d: %w", num, p.rank, err)
	}
	g := &tgt{qp: qp}
	t.tgts[p.rank] = g
	t.m.tgtOpened.Inc()
	t.learnTGT(g, p)
	return nil
}

// learnTGT records that frames arriving on g come from p.
func (t *Transport) learnTGT(g *tgt, p *peer) {
	t.byTgt[g.qp.Num()] = p
	p.known = true
}
