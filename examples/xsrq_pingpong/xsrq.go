package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"

	"github.com/xrcrun/xrc/verbs"
)

// pingpong is one process's XRC objects and its peers: the server's
// clients, or a client's server.
type pingpong struct {
	o      *options
	dev    *verbs.Context
	ch     *verbs.CompChannel // with -e
	pd     *verbs.PD
	buf    []byte
	mr     *verbs.MR
	file   *os.File // the domain's file
	xrcd   *verbs.XRCD
	recvCQ *verbs.CQ // the XRC SRQ's completions
	sendCQ *verbs.CQ
	srq    *verbs.SRQ
	recvQP []*verbs.QP // XRC receive (TGT) QPs, one per peer
	sendQP []*verbs.QP // XRC send (INI) QPs, one per peer
	peers  []peer
	my     dest // the LID, SRQ number and GID all peers get
}

// peer is the other side of one pair of QPs.
type peer struct {
	rem   dest
	psn   uint32   // the PSN this side starts its sends with
	conn  net.Conn // the TCP connection addresses came over
	count int      // messages sent to it
}

// newPingpong creates the objects of ibv_xsrq_pingpong on dev; a domain
// file it cannot open is reported to stderr. On error, close frees what was
// made.
func newPingpong(dev *verbs.Context, o *options, stderr io.Writer) (*pingpong, error) {
	p := &pingpong{o: o, dev: dev, peers: make([]peer, o.clients)}
	port, err := dev.QueryPort(uint8(o.ibPort))
	if err != nil {
		return p, fmt.Errorf("failed to get port info: %w", err)
	}
	p.my.lid = port.LID
	if port.LinkLayer != verbs.LinkLayerEthernet && port.LID == 0 {
		return p, errors.New("couldn't get local LID")
	}
	if o.gidIdx > 0 {
		return p, fmt.Errorf("gid index %d: this device has GID 0 only", o.gidIdx)
	}
	if o.gidIdx == 0 || port.LinkLayer == verbs.LinkLayerEthernet {
		p.my.gid = port.GID
	}
	if p.buf, err = verbs.Alloc(o.size); err != nil {
		return p, fmt.Errorf("couldn't allocate work buf: %w", err)
	}
	if o.events {
		if p.ch, err = dev.CreateCompChannel(); err != nil {
			return p, fmt.Errorf("couldn't create completion channel: %w", err)
		}
	}
	if p.pd, err = dev.AllocPD(); err != nil {
		return p, fmt.Errorf("couldn't allocate PD: %w", err)
	}
	if p.mr, err = p.pd.RegMR(p.buf, verbs.AccessLocalWrite); err != nil {
		return p, fmt.Errorf("couldn't register MR: %w", err)
	}
	// As ibv_xsrq_pingpong, a file that cannot be opened leaves a domain
	// of this process only.
	if p.file, err = os.OpenFile(o.xrcdFile, os.O_RDONLY|os.O_CREATE, 0o440); err != nil {
		fmt.Fprintf(stderr, "xsrq_pingpong: no file for the XRC domain, using a private one: %v\n", err)
		p.file = nil
	}
	if p.xrcd, err = dev.OpenXRCD(p.file, os.O_CREATE); err != nil {
		return p, fmt.Errorf("couldn't open the XRC domain: %w", err)
	}
	if p.recvCQ, err = dev.CreateCQ(o.clients, p.ch, 0); err != nil {
		return p, fmt.Errorf("couldn't create recv CQ: %w", err)
	}
	if o.events {
		if err := p.recvCQ.RequestNotify(false); err != nil {
			return p, fmt.Errorf("couldn't request CQ notification: %w", err)
		}
	}
	if p.sendCQ, err = dev.CreateCQ(o.clients, nil, 0); err != nil {
		return p, fmt.Errorf("couldn't create send CQ: %w", err)
	}
	if p.srq, err = p.pd.CreateXRCSRQ(p.xrcd, p.recvCQ, verbs.SRQAttr{MaxWR: uint32(o.clients), MaxSGE: 1}); err != nil {
		return p, fmt.Errorf("couldn't create SRQ: %w", err)
	}
	p.my.srqn = p.srq.Num()
	return p, p.createQPs()
}

// createQPs makes a receive and a send QP per peer and moves them to INIT.
func (p *pingpong) createQPs() error {
	initMask := verbs.QPAttrState | verbs.QPAttrPkeyIndex | verbs.QPAttrPort | verbs.QPAttrAccessFlags
	for i := range p.o.clients {
		qp, err := p.xrcd.CreateTgtQP()
		if err != nil {
			return fmt.Errorf("couldn't create recv QP[%d]: %w", i, err)
		}
		p.recvQP = append(p.recvQP, qp)
		if err := qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: uint8(p.o.ibPort),
			AccessFlags: verbs.AccessRemoteWrite | verbs.AccessRemoteRead}, initMask); err != nil {
			return fmt.Errorf("failed to modify recv QP[%d] to INIT: %w", i, err)
		}
		qp, err = p.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTXRCIni, SendCQ: p.sendCQ,
			Cap: verbs.QPCap{MaxSendWR: uint32(p.o.clients * p.o.iters), MaxSendSGE: 1}})
		if err != nil {
			return fmt.Errorf("couldn't create send QP[%d]: %w", i, err)
		}
		p.sendQP = append(p.sendQP, qp)
		if err := qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: uint8(p.o.ibPort)}, initMask); err != nil {
			return fmt.Errorf("failed to modify send QP[%d] to INIT: %w", i, err)
		}
	}
	return nil
}

// connect brings the QPs of peer i to RTS toward the peer's: the receive
// QP takes the peer's send QP's messages, the send QP reaches the peer's
// receive QP.
func (p *pingpong) connect(i int) error {
	rem := p.peers[i].rem
	av := verbs.AHAttr{DLID: rem.lid, SL: uint8(p.o.sl), Port: uint8(p.o.ibPort)}
	if rem.gid != (verbs.GID{}) {
		av.IsGlobal = true
		av.GRH = verbs.GlobalRoute{DGID: rem.gid, HopLimit: 5, SGIDIndex: uint8(max(p.o.gidIdx, 0))}
	}
	steps := []struct {
		qp   *verbs.QP
		what string
		attr verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{p.recvQP[i], "recv QP", verbs.QPAttr{State: verbs.QPSRTR, DestQPN: rem.sendQPN, PathMTU: p.o.mtu,
			RQPSN: rem.psn, MinRNRTimer: 12, AH: av},
			verbs.QPAttrState | verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN |
				verbs.QPAttrRQPSN | verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer},
		{p.recvQP[i], "recv QP", verbs.QPAttr{State: verbs.QPSRTS, Timeout: 14, SQPSN: p.peers[i].psn},
			verbs.QPAttrState | verbs.QPAttrTimeout | verbs.QPAttrSQPSN},
		{p.sendQP[i], "send QP", verbs.QPAttr{State: verbs.QPSRTR, DestQPN: rem.recvQPN, PathMTU: p.o.mtu,
			RQPSN: rem.psn, AH: av},
			verbs.QPAttrState | verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN},
		{p.sendQP[i], "send QP", verbs.QPAttr{State: verbs.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7,
			SQPSN: p.peers[i].psn},
			verbs.QPAttrState | verbs.QPAttrTimeout | verbs.QPAttrSQPSN | verbs.QPAttrRetryCnt |
				verbs.QPAttrRNRRetry | verbs.QPAttrMaxQPRdAtomic},
	}
	for _, s := range steps {
		if err := s.qp.Modify(&s.attr, s.mask); err != nil {
			return fmt.Errorf("failed to modify %s[%d] to %v: %w", s.what, i, s.attr.State, err)
		}
	}
	return nil
}

// localDest is this side's address for peer i, with a fresh PSN.
func (p *pingpong) localDest(i int) dest {
	p.peers[i].psn = rand.Uint32() & 0xffffff
	d := p.my
	d.recvQPN, d.sendQPN, d.psn = p.recvQP[i].Num(), p.sendQP[i].Num(), p.peers[i].psn
	return d
}

// postRecv posts n receives of the whole buffer to the SRQ.
func (p *pingpong) postRecv(n int) error {
	wr := &verbs.RecvWR{SG: []verbs.SGE{p.mr.SGE(0, p.o.size)}}
	for range n {
		if err := p.srq.PostRecv(wr); err != nil {
			return fmt.Errorf("failed to post receive to SRQ: %w", err)
		}
	}
	return nil
}

// postSend sends the next message to peer i's SRQ, through the send QP
// after the one used last: a server spreads each client's messages over
// the receive QPs of all clients. The last message to a peer is signaled.
func (p *pingpong) postSend(i int) error {
	pr := &p.peers[i]
	qpi := (i + pr.count) % p.o.clients
	pr.count++
	var flags verbs.SendFlags
	if pr.count >= p.o.iters {
		flags = verbs.SendSignaled
	}
	err := p.sendQP[qpi].PostSend(&verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSend, Flags: flags,
		SG: []verbs.SGE{p.mr.SGE(0, p.o.size)}, RemoteSRQNum: pr.rem.srqn})
	if err != nil {
		return fmt.Errorf("couldn't post send to client %d on QP[%d]: %w", i, qpi, err)
	}
	return nil
}

// peerOf returns the peer whose messages arrive on the receive QP qpn.
func (p *pingpong) peerOf(qpn uint32) (int, error) {
	if p.o.clients == 1 {
		return 0, nil // a client's messages come on any receive QP of its node
	}
	for i, qp := range p.recvQP {
		if qp.Num() == qpn {
			return i, nil
		}
	}
	return 0, fmt.Errorf("unable to find qp %x", qpn)
}

// testHookTermination, when set (by tests), runs on the server once every
// message has arrived and before the final handshake, while every object
// of every process is alive.
var testHookTermination func()

// run connects to the peers, exchanges the messages and does the final
// handshake.
func (p *pingpong) run(ctx context.Context, out io.Writer) error {
	if err := p.postRecv(p.o.clients); err != nil {
		return fmt.Errorf("couldn't post receives: %w", err)
	}
	if p.o.server != "" {
		if err := p.clientConnect(ctx, out); err != nil {
			return err
		}
	} else {
		if err := p.serverConnect(ctx, out); err != nil {
			return err
		}
		for i := range p.o.clients {
			if err := p.postSend(i); err != nil {
				return err
			}
		}
	}
	if err := p.exchange(ctx); err != nil {
		return err
	}
	if p.o.server != "" {
		return p.clientTermination()
	}
	if testHookTermination != nil {
		testHookTermination()
	}
	return p.serverTermination()
}

// exchange receives every message of every peer, answering each while
// the peer is owed messages, then waits for the signaled last sends.
func (p *pingpong) exchange(ctx context.Context) error {
	wc := make([]verbs.WorkCompletion, 1)
	for cnt, total := 0, p.o.clients*p.o.iters; cnt < total; {
		if err := ctx.Err(); err != nil {
			return err
		}
		if p.o.events {
			if _, err := p.ch.GetEvent(ctx); err != nil {
				return fmt.Errorf("failed to get cq_event: %w", err)
			}
			if err := p.recvCQ.RequestNotify(false); err != nil {
				return fmt.Errorf("couldn't request CQ notification: %w", err)
			}
		}
		for {
			ne, err := p.recvCQ.Poll(wc)
			if err != nil {
				return fmt.Errorf("error polling cq: %w", err)
			}
			if ne == 0 {
				break
			}
			if wc[0].Status != verbs.WCSuccess {
				return fmt.Errorf("work completion error %v (%d)", wc[0].Status, wc[0].Status)
			}
			if err := p.postRecv(1); err != nil {
				return err
			}
			i, err := p.peerOf(wc[0].QPNum)
			if err != nil {
				return err
			}
			if p.peers[i].count < p.o.iters {
				if err := p.postSend(i); err != nil {
					return err
				}
			}
			cnt++
		}
	}
	for n := 0; n < p.o.clients; {
		if err := ctx.Err(); err != nil {
			return err
		}
		ne, err := p.sendCQ.Poll(wc)
		if err != nil {
			return fmt.Errorf("error polling cq: %w", err)
		}
		if ne > 0 && wc[0].Status != verbs.WCSuccess {
			return fmt.Errorf("send completion error %v (%d) for client %d", wc[0].Status, wc[0].Status, wc[0].WRID)
		}
		n += ne
	}
	return nil
}

// close destroys what newPingpong made, in ibv_xsrq_pingpong's order, and
// closes the peers' connections.
func (p *pingpong) close() error {
	var errs []error
	closeObj := func(c interface{ Close() error }, what string) {
		if err := c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("couldn't destroy %s: %w", what, err))
		}
	}
	for i := range p.sendQP {
		closeObj(p.sendQP[i], fmt.Sprintf("INI QP[%d]", i))
	}
	for i := range p.recvQP {
		closeObj(p.recvQP[i], fmt.Sprintf("TGT QP[%d]", i))
	}
	for _, pr := range p.peers {
		if pr.conn != nil {
			pr.conn.Close()
		}
	}
	if p.srq != nil {
		closeObj(p.srq, "SRQ")
	}
	if p.xrcd != nil {
		closeObj(p.xrcd, "the XRC domain")
	}
	if p.file != nil {
		closeObj(p.file, "the file of the XRC domain")
	}
	for _, cq := range []struct {
		cq   *verbs.CQ
		what string
	}{{p.sendCQ, "send CQ"}, {p.recvCQ, "recv CQ"}} {
		if cq.cq != nil {
			closeObj(cq.cq, cq.what)
		}
	}
	if p.mr != nil {
		closeObj(p.mr, "MR")
	}
	if p.pd != nil {
		closeObj(p.pd, "PD")
	}
	if p.ch != nil {
		closeObj(p.ch, "completion channel")
	}
	if p.buf != nil {
		verbs.Free(p.buf)
	}
	return errors.Join(errs...)
}
