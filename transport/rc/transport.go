// Package rc is the RC transport: one reliable-connected queue pair per
// remote process (design D5), for the ranks of other nodes.
//
// Eager frames travel as SEND_WITH_IMM into one shared receive queue per
// process, whose pre-registered buffers are reposted as soon as the frame
// is delivered. Each remote rank may have a fixed share of those buffers
// outstanding (its credits); the receiver returns credits in the
// immediate data of every frame it sends back, and in a zero-length
// credit message when it has freed half a share with nothing else to
// send, so a sender blocks (TrySend says false) instead of overflowing
// the receiver. RNR retries (rnr_retry 7, min_rnr_timer 0.64 ms) are the
// last resort when the shares are overcommitted.
//
// Large payloads are pulled by the receiver with RDMA READs over its own
// QP toward the sender: Expose registers the sender's buffer (through a
// registration cache) and describes it in a Remote; Read posts the reads,
// split into chunks, and Progress reports their end.
//
// QPs are connected either all at Connect, from the QPNs and PSNs every
// rank published in its record, or lazily, at the first TrySend or Read
// toward a peer, through write-once keys of the bootstrap server (see
// lazy.go).
//
// # Memory
//
// The transport owns every object it creates on the caller's device (PD,
// CQ, completion channel, SRQ, QPs, memory regions) and the memory of its
// receive and send buffers, until Close. A buffer passed to Expose belongs
// to the caller, who keeps it alive and unmoved until Unexpose; the
// transport keeps it registered (and so pinned) until then, and possibly
// longer, in its cache. A Read's destination must stay alive until its
// ReadDone.
//
// # Goroutines
//
// The transport.Transport methods are called from one goroutine. Two
// goroutines of the transport's own wait for completion events (and call
// Config.Kick) and for the device's async events (SRQ limit, QP errors);
// with lazy connection, a third reads the rank's connection requests. Close
// stops them.
package rc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/transport/internal/verbsx"
	"github.com/xrcrun/xrc/verbs"
)

// Transport is the RC transport of one rank.
type Transport struct {
	cfg  Config
	log  *slog.Logger
	m    *metrics
	n    int // ranks in the job
	port verbs.PortAttr
	// inline is the largest frame sent inline.
	inline int

	// core holds the PD, the CQ, the SRQ and its buffers, the send
	// buffers, the registration cache and the reads.
	core *verbsx.Core

	peers   []*peer // by rank; nil for this node's ranks
	remotes int
	byQPN   map[uint32]*peer
	credits uint32 // frames a sender may have unconsumed at one receiver
	refund  uint32 // freed frames that make a credit message worth sending

	dirty []*peer // peers with reads to post or credits to return

	// setupTime is the time spent making QPs and changing their states;
	// handshake the time lazy connections took from the first need to
	// RTS, summed over peers.
	setupTime, handshake time.Duration

	lz     *lazy // nil unless Config.Lazy
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed bool
}

var _ transport.Transport = (*Transport)(nil)

// Tunables of the QPs.
const (
	inlineSize  = 96 // frames up to this size go inline
	minRNRTimer = 12 // 0.64 ms
	rnrRetry    = 7  // retry forever: RNR is flow control's last resort
	qpTimeout   = 14 // 67 ms
	retryCount  = 7  // transport retries before a QP fails
)

// New creates the rank's PD, CQ, SRQ and buffers and, unless cfg.Lazy, a
// QP toward every rank of another node, so that Record can publish them.
func New(cfg Config) (*Transport, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	t := &Transport{cfg: cfg, log: cfg.Logger.With("transport", "rc", "rank", cfg.Rank), n: len(cfg.Nodes),
		peers: make([]*peer, len(cfg.Nodes)), byQPN: map[uint32]*peer{}}
	me := cfg.Nodes[cfg.Rank]
	for r, node := range cfg.Nodes {
		if node != me {
			t.peers[r] = &peer{rank: r}
			t.remotes++
		}
	}
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
		t.lz = &lazy{t: t, mbox: verbsx.NewMailbox(cfg.Bootstrap, "rc"), ctx: ctx, failed: map[int]error{}}
		t.wg.Go(func() { t.lz.readMailbox(ctx) })
	}
	return t, nil
}

func (t *Transport) setup() error {
	cfg := t.cfg
	// Every remote rank gets an equal share of the receive buffers.
	t.credits, t.refund = verbsx.Shares(cfg.SRQDepth, t.remotes)
	var err error
	t.core, err = verbsx.NewCore(verbsx.CoreConfig{Device: cfg.Device, Port: cfg.Port,
		Sizes: verbsx.Sizes{EagerSize: cfg.EagerSize, SRQDepth: cfg.SRQDepth, SendSlots: cfg.SendSlots, SendDepth: cfg.SendDepth},
		CQE:   cfg.SRQDepth + t.remotes*cfg.SendDepth + 16, RecvWRID: wrRecv,
		NewSRQ: func(pd *verbs.PD, _ *verbs.CQ) (*verbs.SRQ, error) {
			return pd.CreateSRQ(verbs.SRQAttr{MaxWR: uint32(cfg.SRQDepth), MaxSGE: 1})
		}})
	if err != nil {
		return fmt.Errorf("rc: %w", err)
	}
	t.port = t.core.Port
	t.m.SRQPosted.Set(float64(cfg.SRQDepth))
	if cfg.Lazy {
		return nil
	}
	for _, p := range t.peers {
		if p != nil {
			if err := t.createQP(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// createQP makes p's QP and takes it to INIT.
func (t *Transport) createQP(p *peer) error {
	start := time.Now()
	p.started = start
	defer func() { t.setupTime += time.Since(start) }()
	qp, err := t.core.PD.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: t.core.CQ, RecvCQ: t.core.CQ, SRQ: t.core.Recv.SRQ,
		Cap: verbs.QPCap{MaxSendWR: uint32(t.cfg.SendDepth), MaxSendSGE: 2, MaxInlineData: inlineSize}})
	if err != nil {
		return fmt.Errorf("rc: QP for rank %d: %w", p.rank, err)
	}
	p.qp, p.psn = qp, rand.Uint32N(1<<24)
	t.byQPN[qp.Num()] = p
	t.m.qps.Inc()
	if t.inline == 0 {
		t.inline = int(min(inlineSize, qp.Cap().MaxInlineData))
	}
	err = qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: t.cfg.Port,
		AccessFlags: verbs.AccessRemoteRead}, verbs.QPAttrState|verbs.QPAttrPkeyIndex|verbs.QPAttrPort|verbs.QPAttrAccessFlags)
	if err != nil {
		return fmt.Errorf("rc: QP for rank %d: %w", p.rank, err)
	}
	return nil
}

// bringUp takes p's QP from INIT to RTS toward the peer's QP qpn, whose
// first PSN is psn.
func (t *Transport) bringUp(p *peer, qpn, psn uint32) error {
	start := time.Now()
	defer func() { t.setupTime += time.Since(start) }()
	mtu := min(t.port.ActiveMTU, p.rec.mtu)
	err := p.qp.Modify(&verbs.QPAttr{State: verbs.QPSRTR, PathMTU: mtu, DestQPN: qpn, RQPSN: psn,
		MaxDestRdAtomic: uint8(t.core.MaxRd), MinRNRTimer: minRNRTimer,
		AH: verbs.AHAttr{IsGlobal: true, Port: t.cfg.Port, GRH: verbs.GlobalRoute{DGID: p.rec.gid, HopLimit: 64}}},
		verbs.QPAttrState|verbs.QPAttrAV|verbs.QPAttrPathMTU|verbs.QPAttrDestQPN|verbs.QPAttrRQPSN|
			verbs.QPAttrMaxDestRdAtomic|verbs.QPAttrMinRNRTimer)
	if err == nil {
		err = p.qp.Modify(&verbs.QPAttr{State: verbs.QPSRTS, Timeout: qpTimeout, RetryCnt: retryCount,
			RNRRetry: rnrRetry, SQPSN: p.psn, MaxRdAtomic: uint8(t.core.MaxRd)},
			verbs.QPAttrState|verbs.QPAttrTimeout|verbs.QPAttrRetryCnt|verbs.QPAttrRNRRetry|
				verbs.QPAttrSQPSN|verbs.QPAttrMaxQPRdAtomic)
	}
	if err != nil {
		return fmt.Errorf("rc: connect to rank %d (QPN %#x): %w", p.rank, qpn, err)
	}
	p.state = peerReady
	t.m.Connects.Inc()
	if t.lz != nil {
		t.handshake += time.Since(p.started)
	}
	return nil
}

// Name is "rc".
func (t *Transport) Name() string { return "rc" }

// Record describes this rank's port and the QP it made for each rank.
func (t *Transport) Record() []byte {
	r := record{mtu: t.port.ActiveMTU, gid: t.port.GID, qpns: make([]uint32, t.n), psns: make([]uint32, t.n)}
	for i, p := range t.peers {
		if p != nil && p.qp != nil {
			r.qpns[i], r.psns[i] = p.qp.Num(), p.psn
		}
	}
	return r.encode()
}

// Connect reads every remote rank's record and, unless connecting lazily,
// brings the QP toward it to RTS. A peer's QP may reach RTR after this
// rank starts sending: RC retransmits until it does, so a caller that
// wants no retransmissions waits at a barrier after Connect.
func (t *Transport) Connect(ctx context.Context, peers []transport.Peer) error {
	if len(peers) != t.n {
		return fmt.Errorf("rc: %d peers for a job of %d", len(peers), t.n)
	}
	for i, pr := range peers {
		if pr.Rank != i {
			return fmt.Errorf("rc: peer %d says it is rank %d", i, pr.Rank)
		}
		p := t.peers[i]
		if p == nil {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rec, err := parseRecord(pr.Record, t.n)
		if err != nil {
			t.m.Bad.Inc()
			return fmt.Errorf("rank %d: %w", pr.Rank, err)
		}
		p.rec = rec
		if t.lz != nil {
			continue
		}
		if rec.qpns[t.cfg.Rank] == 0 {
			t.m.Bad.Inc()
			return fmt.Errorf("rc: rank %d made no QP for rank %d (does it connect lazily?)", pr.Rank, t.cfg.Rank)
		}
		if err := t.bringUp(p, rec.qpns[t.cfg.Rank], rec.psns[t.cfg.Rank]); err != nil {
			return err
		}
	}
	if t.lz != nil {
		t.lz.connected.Store(true)
		t.cfg.Kick()
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
		return nil, fmt.Errorf("rc: rank %d: not connected yet", rank)
	}
	return p, nil
}

// Close destroys the QPs and everything else the transport made, and
// stops its goroutines. Work in flight is discarded: callers close after
// their peers no longer need it (comm: after Finalize's barrier).
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
	for _, p := range t.peers {
		if p != nil && p.qp != nil {
			errs = append(errs, p.qp.Close())
			p.qp = nil
			t.m.qps.Dec()
		}
	}
	if t.core != nil {
		errs = append(errs, t.core.Close())
	}
	t.m.Unregister()
	return errors.Join(errs...)
}
