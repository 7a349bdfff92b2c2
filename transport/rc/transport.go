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
// # Failures
//
// A QP that fails fails its peer for good (there is no reconnection): a
// completion in error (transport or RNR retries exhausted, a remote
// access or operation error), a QP error event (the QP failed as a
// responder: a request it refused; the only word of it when this rank had
// no work on the QP), or a lazy connection that could not be made or was
// refused. Every later TrySend and Read toward the peer returns the
// error, its reads in flight end with it, and a Handler that is a
// transport.PeerFailureHandler hears of it once, from the first Progress
// whose poll left the CQ empty (the frames that came before are delivered
// first; none is after). The error names the rank and wraps the
// verbs.WCStatus or verbs.EventType that told. A peer that just stops
// (its process or node gone) is noticed when work toward it runs out of
// retries: a rank that only waits for it sends nothing and hears nothing.
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
// Config.Kick; the CQ is armed only by Arm, which the caller calls before
// it sleeps) and for the device's async events (SRQ limit, QP errors);
// with lazy connection, a third reads the rank's connection requests. Close
// stops them.
package rc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/transport/internal/verbsx"
	"github.com/xrcrun/xrc/verbs"
)

// Transport is the RC transport of one rank.
type Transport struct {
	cfg Config
	log *slog.Logger
	m   *verbsx.Metrics
	n   int // ranks in the job

	// e holds the PD, the CQ, the SRQ and its buffers, the send buffers,
	// the registration cache and the reads, and carries the frames, credit
	// messages and reads through the peers' QPs.
	e     *verbsx.Endpoint
	peers []*peer // by rank; nil for this node's ranks

	lz *lazy // nil unless Config.Lazy

	failBringUp error // a test hook: bringUp fails with it
}

var _ transport.Transport = (*Transport)(nil)

// New creates the rank's PD, CQ, SRQ and buffers and, unless cfg.Lazy, a
// QP toward every rank of another node, so that Record can publish them.
func New(cfg Config) (*Transport, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	t := &Transport{cfg: cfg, log: cfg.Logger.With("transport", "rc", "rank", cfg.Rank), n: len(cfg.Nodes),
		peers: make([]*peer, len(cfg.Nodes))}
	me := cfg.Nodes[cfg.Rank]
	vps, remotes := make([]*verbsx.Peer, len(cfg.Nodes)), 0
	for r, node := range cfg.Nodes {
		if node != me {
			t.peers[r] = newPeer(r)
			vps[r] = &t.peers[r].Peer
			remotes++
		}
	}
	m, qps, err := newMetrics(cfg.Registerer, cfg.Rank)
	if err != nil {
		return nil, err
	}
	t.m = m
	t.e, err = verbsx.NewEndpoint(verbsx.EndpointConfig{
		CoreConfig: verbsx.CoreConfig{Device: cfg.Device, Port: cfg.Port,
			Sizes: verbsx.Sizes{EagerSize: cfg.EagerSize, SRQDepth: cfg.SRQDepth, SendSlots: cfg.SendSlots, SendDepth: cfg.SendDepth},
			CQE:   cfg.SRQDepth + remotes*cfg.SendDepth + 16,
			NewSRQ: func(pd *verbs.PD, _ *verbs.CQ) (*verbs.SRQ, error) {
				return pd.CreateSRQ(verbs.SRQAttr{MaxWR: uint32(cfg.SRQDepth), MaxSGE: 1})
			}},
		Name: "rc", Magic: remoteMagic, Rank: cfg.Rank, Peers: vps, Nodes: cfg.Nodes, Kick: cfg.Kick,
		Log: t.log, Metrics: m, QPs: qps, RecvQPKey: "qpn"})
	if err == nil {
		err = t.createQPs()
	}
	if err != nil {
		return nil, errors.Join(err, t.teardown())
	}
	ctx := t.e.Run()
	if cfg.Lazy {
		t.lz = &lazy{t: t, mbox: verbsx.NewMailbox(cfg.Bootstrap, "rc"), ctx: ctx, failed: map[int]error{}}
		t.e.Lazy = t.lz
		t.e.Go(func() { t.lz.readMailbox(ctx) })
	}
	return t, nil
}

// createQPs makes the QP toward every peer, unless connecting lazily.
func (t *Transport) createQPs() error {
	if t.cfg.Lazy {
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
	c := t.e.Core
	err := t.e.MakeQP(&p.conn, verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: c.CQ, RecvCQ: c.CQ, SRQ: c.Recv.SRQ})
	if p.conn.QP != nil {
		t.e.Receives(p.conn.QP.Num(), &p.Peer)
	}
	if err != nil {
		return fmt.Errorf("rc: QP for rank %d: %w", p.Rank, err)
	}
	return nil
}

// bringUp takes p's QP from INIT to RTS toward the peer's QP qpn, whose
// first PSN is psn.
func (t *Transport) bringUp(p *peer, qpn, psn uint32) error {
	to := verbsx.Dest{GID: p.rec.gid, MTU: p.rec.mtu, QPN: qpn, PSN: psn}
	err := t.failBringUp
	if err == nil {
		err = t.e.BringUp(&p.conn, to, true)
	}
	if err != nil {
		return fmt.Errorf("rc: connect to rank %d (QPN %#x): %w", p.Rank, qpn, err)
	}
	return nil
}

// Name is "rc".
func (t *Transport) Name() string { return "rc" }

// Record describes this rank's port and the QP it made for each rank.
func (t *Transport) Record() []byte {
	port := t.e.Core.Port
	r := record{mtu: port.ActiveMTU, gid: port.GID, qpns: make([]uint32, t.n), psns: make([]uint32, t.n)}
	for i, p := range t.peers {
		if p != nil && p.conn.QP != nil {
			r.qpns[i], r.psns[i] = p.conn.QP.Num(), p.conn.PSN
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
		p.rec, p.Recorded = rec, true
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
func (t *Transport) Reaches(rank int) bool { return t.e.Reaches(rank) }

// MaxEager is the size of a receive buffer.
func (t *Transport) MaxEager() int { return t.e.MaxEager() }

// Close destroys the QPs and everything else the transport made, and
// stops its goroutines. Work in flight is discarded: callers close after
// their peers no longer need it (comm: after Finalize's barrier).
func (t *Transport) Close() error { return t.e.Close(t.teardown) }

func (t *Transport) teardown() error {
	err := t.e.Free()
	t.m.Unregister()
	return err
}
