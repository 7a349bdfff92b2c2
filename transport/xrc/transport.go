// Package xrc is the XRC transport (design D5): per node one XRC domain,
// per rank one XRC SRQ and one INI (send) QP per remote node, shared by
// the traffic toward every rank of that node, and per node one TGT
// (receive) QP per remote rank's INI QP toward it, created by one rank of
// the node and opened by the others. A node of c ranks in a job of N
// nodes holds c(N−1) INI and c(N−1) TGT QPs, against c²(N−1) RC QPs.
//
// Every send names the destination's SRQ (SendWR.RemoteSRQNum), which the
// senders learn from the records. Eager frames travel as SEND_WITH_IMM
// into the receiver's SRQ, with per-rank credits in the immediate data as
// transport/rc does (verbsx.Credits); a receive completion names the TGT
// QP it came through, and so the sending rank. The INI QP's send queue is
// shared by all ranks of its node: one bound on its outstanding work
// requests (sends, credit messages, reads) and one on its RDMA READs.
//
// Large payloads are pulled by the receiver with RDMA READs over its own
// INI QP toward the sender's node; each READ names the SRQ of the rank
// that exposed the memory, whose PD the remote device checks the rkey
// against.
//
// QPs are connected either at Connect, from the records (eager: each rank
// of a node creates the TGT QPs of the remote ranks r with r mod c equal
// to its index on the node, and publishes them), or at the first TrySend
// or Read toward a node, through write-once keys of the bootstrap server
// (lazy.go).
//
// # Failures
//
// Failures are for good, as with rc, and a Handler that is a
// transport.PeerFailureHandler hears once of every peer this rank can no
// longer hear from (verbsx.Endpoint's Progress). Two kinds of QP carry a
// peer's traffic, and both count:
//
//   - The TGT QP of a peer's INI QP, the node's (an async error event, to
//     every rank of the node that holds it): nothing more comes from that
//     peer to any rank of this node. The peer is failed; its own INI QP,
//     which the TGT QP no longer answers, fails too (at once on the NAK
//     of a refused request, else when its retries run out), so it can no
//     longer take this rank's credits or replies either: sends to it and
//     reads from it fail as well, though this rank's INI QP toward its
//     node still carries the traffic toward its other ranks.
//   - This rank's INI QP toward a node (a completion in error, an error
//     event, a lazy connection that failed): every rank of the node is
//     failed. Their frames could still come, through their INI QPs, but
//     this rank cannot send to them, read their rendezvous payloads or
//     return them credits, so each stops once its share is used up, and a
//     protocol that needs an answer (rendezvous) cannot finish: a receive
//     from them could wait for ever. What they send after the report is
//     dropped, so that the handler is told the truth (nothing more comes).
//
// One rank that dies or misbehaves can so cut a node off from a remote
// rank: an INI QP that names an SRQ gone with its rank (a Remote Access
// NAK) fails toward all the ranks of that node, as XRC shares the QP. That
// is the price of c(N−1) QPs instead of c²(N−1); the report says which
// QP failed and why (the error wraps the verbs.WCStatus or
// verbs.EventType).
//
// # Memory
//
// The transport owns every object it creates on the caller's device (XRC
// domain handle, PD, CQ, completion channel, XRC SRQ, INI QPs, its
// handles of TGT QPs, memory regions) and the memory of its receive and
// send buffers, until Close. A buffer passed to Expose belongs to the
// caller, who keeps it alive and unmoved until Unexpose; the transport
// keeps it registered (pinned) until then, and possibly longer, in its
// cache. A Read's destination must stay alive until its ReadDone. TGT QPs
// belong to the node's domain and live while any rank of the node holds
// them.
//
// # Goroutines
//
// The transport.Transport methods are called from one goroutine. Two
// goroutines of the transport wait for completion events (and call
// Config.Kick; the CQ is armed only by Arm, which the caller calls before
// it sleeps) and for the device's async events; with lazy connection,
// another reads the rank's mailbox and short-lived ones put and get
// bootstrap keys. Verbs objects are only made and modified by the calling
// goroutine. Close stops them all.
package xrc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/transport/internal/verbsx"
	"github.com/xrcrun/xrc/verbs"
)

// Transport is the XRC transport of one rank.
type Transport struct {
	cfg Config
	log *slog.Logger
	m   *metrics
	n   int // ranks in the job

	// e holds the PD, the CQ, the XRC SRQ and its buffers, the send
	// buffers, the registration cache and the reads, and carries the
	// frames, credit messages and reads through the INI QPs; xrcd is the
	// node's domain as this rank opened it.
	e    *verbsx.Endpoint
	xrcd *verbs.XRCD

	ranksOf map[int][]int // the ranks of each node, in order
	nodes   []*node       // remote nodes, by id
	peers   []*peer       // by rank; nil for this node's ranks
	tgts    map[int]*tgt  // by remote rank: the TGT QP of its INI QP, as this rank holds it

	lz *lazy // nil unless Config.Lazy

	failTGT error // a test hook: createTGT fails with it
}

// tgt is a TGT QP as this rank holds it: created, or opened.
type tgt struct {
	qp      *verbs.QP
	created bool
}

var _ transport.Transport = (*Transport)(nil)

// New opens the node's XRC domain and creates the rank's PD, CQ, XRC SRQ
// and buffers and, unless cfg.Lazy, an INI QP toward every other node and
// the TGT QPs this rank creates for its node, so that Record can publish
// them.
func New(cfg Config) (*Transport, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	t := &Transport{cfg: cfg, log: cfg.Logger.With("transport", "xrc", "rank", cfg.Rank), n: len(cfg.Nodes),
		ranksOf: map[int][]int{}, peers: make([]*peer, len(cfg.Nodes)), tgts: map[int]*tgt{}}
	me := cfg.Nodes[cfg.Rank]
	byNode := map[int]*node{}
	vps := make([]*verbsx.Peer, len(cfg.Nodes))
	for r, id := range cfg.Nodes {
		t.ranksOf[id] = append(t.ranksOf[id], r)
		if id == me {
			continue
		}
		n := byNode[id]
		if n == nil {
			n = &node{id: id, ini: verbsx.NodeConn(id)}
			byNode[id] = n
			t.nodes = append(t.nodes, n)
		}
		p := newPeer(r, n)
		n.peers = append(n.peers, p)
		t.peers[r], vps[r] = p, &p.Peer
	}
	slices.SortFunc(t.nodes, func(a, b *node) int { return a.id - b.id })
	var err error
	if t.m, err = newMetrics(cfg.Registerer, cfg.Rank); err != nil {
		return nil, err
	}
	if err := t.setup(vps); err != nil {
		return nil, errors.Join(err, t.teardown())
	}
	ctx := t.e.Run()
	if cfg.Lazy {
		t.lz = newLazy(t, ctx)
		t.e.Lazy = t.lz
		t.e.Go(func() { t.lz.readMailbox(ctx) })
	}
	return t, nil
}

// setup opens the domain, makes the Endpoint of the peers vps and, unless
// connecting lazily, the INI QPs and the TGT QPs this rank creates.
func (t *Transport) setup(vps []*verbsx.Peer) error {
	cfg := t.cfg
	start := time.Now()
	if err := cfg.Device.Supports(verbs.FeatureXRC); err != nil {
		return fmt.Errorf("xrc: %w", err)
	}
	f, err := os.OpenFile(cfg.DomainFile, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("xrc: domain file: %w", err)
	}
	t.xrcd, err = cfg.Device.OpenXRCD(f, os.O_CREATE)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("xrc: domain of %s: %w", cfg.DomainFile, err)
	}
	t.e, err = verbsx.NewEndpoint(verbsx.EndpointConfig{
		CoreConfig: verbsx.CoreConfig{Device: cfg.Device, Port: cfg.Port,
			Sizes: verbsx.Sizes{EagerSize: cfg.EagerSize, SRQDepth: cfg.SRQDepth, SendSlots: cfg.SendSlots, SendDepth: cfg.SendDepth},
			CQE:   cfg.SRQDepth + len(t.nodes)*cfg.SendDepth + 16,
			NewSRQ: func(pd *verbs.PD, cq *verbs.CQ) (*verbs.SRQ, error) {
				return pd.CreateXRCSRQ(t.xrcd, cq, verbs.SRQAttr{MaxWR: uint32(cfg.SRQDepth), MaxSGE: 1})
			}},
		Name: "xrc", Magic: remoteMagic, Rank: cfg.Rank, Peers: vps, Nodes: cfg.Nodes, Kick: cfg.Kick,
		Log: t.log, Metrics: t.m.Metrics, QPs: t.m.iniQPs, RecvQPKey: "tgt_qpn"})
	if err != nil {
		return err
	}
	t.e.Timed(start)
	if cfg.Lazy {
		return nil
	}
	for _, n := range t.nodes {
		if err := t.createINI(n); err != nil {
			return err
		}
	}
	for r, p := range t.peers {
		if p != nil && t.creator(t.cfg.Nodes[t.cfg.Rank], r) == t.cfg.Rank {
			if _, err := t.createTGT(r); err != nil {
				return err
			}
		}
	}
	return nil
}

// creator is the rank of node that creates, with eager connection, the
// TGT QP for the INI QP of rank (of another node) toward node: the k-th
// rank of the job not on node goes to the (k mod c)-th of node's c ranks,
// so that the node's ranks create equal shares.
func (t *Transport) creator(node, rank int) int {
	rs := t.ranksOf[node]
	below, _ := slices.BinarySearch(rs, rank) // ranks of node below rank
	return rs[(rank-below)%len(rs)]
}

// Name is "xrc".
func (t *Transport) Name() string { return "xrc" }

// Record describes this rank's port, its XRC SRQ, its INI QPs and the TGT
// QPs it created.
func (t *Transport) Record() []byte {
	c := t.e.Core
	r := record{mtu: c.Port.ActiveMTU, gid: c.Port.GID, srqn: c.Recv.SRQ.Num()}
	for _, n := range t.nodes {
		if n.ini.QP != nil {
			r.inis = append(r.inis, iniEntry{node: uint32(n.id), qpn: n.ini.QP.Num(), psn: n.ini.PSN})
		}
	}
	for rank := range t.n {
		if g := t.tgts[rank]; g != nil && g.created {
			r.tgts = append(r.tgts, tgtEntry{rank: uint32(rank), qpn: g.qp.Num()})
		}
	}
	return r.encode(t.n)
}

// Connect reads every rank's record and, unless connecting lazily, brings
// the TGT QPs this rank created to RTR, opens those the other ranks of the
// node created, and brings the INI QPs to RTS. A frame may reach a TGT
// QP before its creator brought it to RTR: RC retransmits until it is, so
// a caller that wants no retransmissions waits at a barrier after
// Connect. The first rank of the node removes the domain file: every rank
// of the node opened it in New, before the records were exchanged. (Close
// removes it too if it is still there: New or Connect failed.)
func (t *Transport) Connect(ctx context.Context, peers []transport.Peer) error {
	if len(peers) != t.n {
		return fmt.Errorf("xrc: %d peers for a job of %d", len(peers), t.n)
	}
	recs := make([]*record, t.n)
	for i, pr := range peers {
		if pr.Rank != i || pr.Node != t.cfg.Nodes[i] {
			return fmt.Errorf("xrc: peer %d says it is rank %d on node %d; rank %d is on node %d", i, pr.Rank, pr.Node, i, t.cfg.Nodes[i])
		}
		rec, err := parseRecord(pr.Record, t.n)
		if err != nil {
			t.m.Bad.Inc()
			return fmt.Errorf("rank %d: %w", i, err)
		}
		recs[i] = rec
		if p := t.peers[i]; p != nil {
			p.rec, p.SRQN, p.Recorded = rec, rec.srqn, true
		}
	}
	if t.lz == nil {
		if err := t.connectAll(ctx, recs); err != nil {
			return err
		}
	}
	me := t.cfg.Nodes[t.cfg.Rank]
	if t.ranksOf[me][0] == t.cfg.Rank {
		t.removeDomainFile()
	}
	if t.lz != nil {
		t.lz.connected.Store(true)
		t.cfg.Kick()
	}
	return nil
}

// connectAll connects everything from the records (eager connection).
func (t *Transport) connectAll(ctx context.Context, recs []*record) error {
	me, rank := t.cfg.Nodes[t.cfg.Rank], t.cfg.Rank
	for s, p := range t.peers {
		if p == nil {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		ini, ok := p.rec.ini(me)
		if !ok {
			t.m.Bad.Inc()
			return fmt.Errorf("xrc: rank %d has no INI QP toward node %d (does it connect lazily?)", s, me)
		}
		c := t.creator(me, s)
		if c == rank {
			if err := t.connectTGT(t.tgts[s], p, ini.qpn, ini.psn); err != nil {
				return err
			}
		} else {
			num := recs[c].tgt(s)
			if num == 0 {
				t.m.Bad.Inc()
				return fmt.Errorf("xrc: rank %d of this node made no TGT QP for rank %d", c, s)
			}
			if err := t.openTGT(p, num); err != nil {
				return err
			}
		}
		p.asked, p.Acked = true, true
	}
	for _, n := range t.nodes {
		c := t.creator(n.id, rank)
		num := recs[c].tgt(rank)
		if num == 0 {
			t.m.Bad.Inc()
			return fmt.Errorf("xrc: rank %d of node %d made no TGT QP for rank %d", c, n.id, rank)
		}
		if err := t.connectINI(n, num, recs[c].gid, recs[c].mtu); err != nil {
			return err
		}
	}
	return nil
}

// Reaches reports whether rank is on another node.
func (t *Transport) Reaches(rank int) bool { return t.e.Reaches(rank) }

// MaxEager is the size of a receive buffer.
func (t *Transport) MaxEager() int { return t.e.MaxEager() }

// Close destroys the INI QPs, closes this rank's handles of TGT QPs (a
// TGT QP lives on while another rank of the node holds it) and frees
// everything else the transport made, and stops its goroutines. Work in
// flight is discarded: callers close after their peers no longer need it
// (comm: after Finalize's barrier).
func (t *Transport) Close() error { return t.e.Close(t.teardown) }

func (t *Transport) teardown() error {
	var errs []error
	for r, g := range t.tgts {
		errs = append(errs, g.qp.Close())
		delete(t.tgts, r)
	}
	errs = append(errs, t.e.Free())
	if t.xrcd != nil {
		errs = append(errs, t.xrcd.Close())
	}
	// Connect removed the domain file, unless it never ran or failed
	// first: then the node's job is failing, and whichever rank closes
	// first removes it, lest it outlive the job.
	t.removeDomainFile()
	t.m.Unregister()
	return errors.Join(errs...)
}

// removeDomainFile removes the node's domain file, if it is still there.
func (t *Transport) removeDomainFile() {
	if err := os.Remove(t.cfg.DomainFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.log.Warn("remove the domain file", "err", err)
	}
}
