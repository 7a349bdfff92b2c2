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
// Config.Kick) and for the device's async events; with lazy connection,
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
	"sync"
	"time"

	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/transport/internal/verbsx"
	"github.com/xrcrun/xrc/verbs"
)

// Transport is the XRC transport of one rank.
type Transport struct {
	cfg    Config
	log    *slog.Logger
	m      *metrics
	n      int // ranks in the job
	inline int // the largest frame sent inline

	// core holds the PD, the CQ, the XRC SRQ and its buffers, the send
	// buffers, the registration cache and the reads; xrcd is the node's
	// domain as this rank opened it.
	core *verbsx.Core
	xrcd *verbs.XRCD

	ranksOf map[int][]int // the ranks of each node, in order
	nodes   []*node       // remote nodes, by id
	byNode  map[int]*node
	peers   []*peer // by rank; nil for this node's ranks
	remotes int
	byINI   map[uint32]*node
	tgts    map[int]*tgt     // by remote rank: the TGT QP of its INI QP, as this rank holds it
	byTgt   map[uint32]*peer // by TGT QPN: whose frames arrive through it
	credits uint32           // frames a sender may have unconsumed at one receiver
	refund  uint32           // freed frames that make a credit message worth sending

	dirty      []*node // nodes with reads to post
	dirtyPeers []*peer // peers with credits to return

	setupTime, handshake time.Duration

	lz     *lazy // nil unless Config.Lazy
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed bool
}

// tgt is a TGT QP as this rank holds it: created, or opened.
type tgt struct {
	qp      *verbs.QP
	created bool
}

var _ transport.Transport = (*Transport)(nil)

// Work request ids: the kind in the top byte, an index below.
const (
	wrRecv   uint64 = 1 << 56 // index: the receive buffer
	wrSend   uint64 = 2 << 56 // index: the send slot, or noSlot (inline)
	wrCredit uint64 = 3 << 56 // a credit message
	wrRead   uint64 = 4 << 56 // index: the read operation
	wrKind   uint64 = 0xff << 56
	noSlot          = verbsx.NoSlot
)

// New opens the node's XRC domain and creates the rank's PD, CQ, XRC SRQ
// and buffers and, unless cfg.Lazy, an INI QP toward every other node and
// the TGT QPs this rank creates for its node, so that Record can publish
// them.
func New(cfg Config) (*Transport, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	t := &Transport{cfg: cfg, log: cfg.Logger.With("transport", "xrc", "rank", cfg.Rank), n: len(cfg.Nodes),
		ranksOf: map[int][]int{}, byNode: map[int]*node{}, peers: make([]*peer, len(cfg.Nodes)),
		byINI: map[uint32]*node{}, tgts: map[int]*tgt{}, byTgt: map[uint32]*peer{}}
	me := cfg.Nodes[cfg.Rank]
	for r, id := range cfg.Nodes {
		t.ranksOf[id] = append(t.ranksOf[id], r)
		if id == me {
			continue
		}
		n := t.byNode[id]
		if n == nil {
			n = &node{id: id}
			t.byNode[id] = n
			t.nodes = append(t.nodes, n)
		}
		p := &peer{rank: r, node: n}
		n.peers = append(n.peers, p)
		t.peers[r] = p
		t.remotes++
	}
	slices.SortFunc(t.nodes, func(a, b *node) int { return a.id - b.id })
	var err error
	if t.m, err = newMetrics(cfg.Registerer, cfg.Rank); err != nil {
		return nil, err
	}
	if err := t.setup(); err != nil {
		return nil, errors.Join(err, t.teardown())
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	t.wg.Go(func() { verbsx.WatchCQ(ctx, t.core.CQ, t.core.Ch, cfg.Kick, t.log, t.m.Metrics) })
	t.wg.Go(func() { verbsx.WatchEvents(ctx, cfg.Device, t.core.Recv, cfg.Kick, t.log, t.m.Metrics) })
	if cfg.Lazy {
		t.lz = newLazy(t, ctx)
		t.wg.Go(func() { t.lz.readMailbox(ctx) })
	}
	return t, nil
}

func (t *Transport) setup() error {
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
	t.credits, t.refund = verbsx.Shares(cfg.SRQDepth, t.remotes)
	t.core, err = verbsx.NewCore(verbsx.CoreConfig{Device: cfg.Device, Port: cfg.Port,
		Sizes: verbsx.Sizes{EagerSize: cfg.EagerSize, SRQDepth: cfg.SRQDepth, SendSlots: cfg.SendSlots, SendDepth: cfg.SendDepth},
		CQE:   cfg.SRQDepth + len(t.nodes)*cfg.SendDepth + 16, RecvWRID: wrRecv,
		NewSRQ: func(pd *verbs.PD, cq *verbs.CQ) (*verbs.SRQ, error) {
			return pd.CreateXRCSRQ(t.xrcd, cq, verbs.SRQAttr{MaxWR: uint32(cfg.SRQDepth), MaxSGE: 1})
		}})
	if err != nil {
		return fmt.Errorf("xrc: %w", err)
	}
	t.m.SRQPosted.Set(float64(cfg.SRQDepth))
	t.setupTime += time.Since(start)
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
	r := record{mtu: t.core.Port.ActiveMTU, gid: t.core.Port.GID, srqn: t.core.Recv.SRQ.Num()}
	for _, n := range t.nodes {
		if n.ini != nil {
			r.inis = append(r.inis, iniEntry{node: uint32(n.id), qpn: n.ini.Num(), psn: n.psn})
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
// of the node opened it in New, before the records were exchanged.
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
			p.rec, p.srqn = rec, rec.srqn
		}
	}
	if t.lz == nil {
		if err := t.connectAll(ctx, recs); err != nil {
			return err
		}
	}
	me := t.cfg.Nodes[t.cfg.Rank]
	if t.ranksOf[me][0] == t.cfg.Rank {
		if err := os.Remove(t.cfg.DomainFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.log.Warn("remove the domain file", "err", err)
		}
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
		p.asked, p.acked = true, true
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
func (t *Transport) Reaches(rank int) bool {
	return rank >= 0 && rank < len(t.peers) && t.peers[rank] != nil
}

// MaxEager is the size of a receive buffer.
func (t *Transport) MaxEager() int { return t.cfg.EagerSize }

func (t *Transport) peer(rank int) (*peer, error) {
	if !t.Reaches(rank) {
		return nil, fmt.Errorf("%w: rank %d", transport.ErrUnreachable, rank)
	}
	p := t.peers[rank]
	if p.rec == nil {
		return nil, fmt.Errorf("xrc: rank %d: not connected yet", rank)
	}
	return p, nil
}

// Close destroys the INI QPs, closes this rank's handles of TGT QPs (a
// TGT QP lives on while another rank of the node holds it) and frees
// everything else the transport made, and stops its goroutines. Work in
// flight is discarded: callers close after their peers no longer need it
// (comm: after Finalize's barrier).
func (t *Transport) Close() error {
	if t.closed {
		return nil
	}
	t.closed = true
	t.cancel()
	t.wg.Wait()
	return t.teardown()
}

func (t *Transport) teardown() error {
	var errs []error
	for _, n := range t.nodes {
		if n.ini != nil {
			errs = append(errs, n.ini.Close())
			n.ini = nil
			t.m.iniQPs.Dec()
		}
	}
	for r, g := range t.tgts {
		errs = append(errs, g.qp.Close())
		delete(t.tgts, r)
	}
	if t.core != nil {
		errs = append(errs, t.core.Close())
	}
	if t.xrcd != nil {
		errs = append(errs, t.xrcd.Close())
	}
	t.m.Unregister()
	return errors.Join(errs...)
}
