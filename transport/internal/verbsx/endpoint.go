package verbsx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/verbs"
)

// EndpointConfig says what NewEndpoint makes.
type EndpointConfig struct {
	CoreConfig
	// Name is the transport's ("rc", "xrc"), which begins its errors;
	// Magic marks its Remotes.
	Name  string
	Magic byte
	// Rank is this rank; Peers the remote ranks, by rank (nil for the
	// ranks of this node); Nodes the node of every rank. A rank's receive
	// buffers are shared among the ranks of the other nodes, so the
	// credits toward a peer depend on its node's size. Every rank of the
	// job must have the same SRQDepth.
	Rank  int
	Peers []*Peer
	Nodes []int
	// Kick wakes the rank (Config.Kick of the transports).
	Kick    func()
	Log     *slog.Logger
	Metrics *Metrics
	// QPs is the transport's gauge of the Conns' QPs.
	QPs prometheus.Gauge
	// RecvQPKey names, in logs, the QP number a receive completion gives
	// ("qpn" for RC, "tgt_qpn" for XRC).
	RecvQPKey string
}

// Connector connects the QPs of a transport lazily.
type Connector interface {
	// Start starts connecting p's Conn; TrySend and Read call it while p
	// is not ready. The error is that of p's Conn, failed.
	Start(p *Peer) error
	// Apply carries out what the connector's goroutines learned.
	// Progress calls it first.
	Apply()
}

// Endpoint is the part of a verbs transport that does not depend on how
// its QPs connect: the Core, the Conns and Peers, the credit shares, the
// frames, credit messages and reads through them, Progress, and the
// goroutines. The transport makes and connects the Conns' QPs (MakeQP,
// BringUp) and says which QP numbers complete whose frames (Receives).
// Owned by the goroutine driving the transport.
type Endpoint struct {
	Core *Core
	// Lazy, when not nil, connects the Conns on demand.
	Lazy Connector

	name       string
	magic      byte
	rank       int
	eager      int // the largest frame
	sendDepth  int // each Conn's send queue
	inline     int // the largest frame sent inline; set by the first QP
	credits    uint32
	refund     uint32
	peers      []*Peer
	conns      []*Conn          // in the order made
	bySend     map[uint32]*Conn // by QPN: whose sends and reads complete
	byRecv     map[uint32]*Peer // by the QPN receive completions name
	dirtyConns []*Conn          // Conns with reads to post
	dirtyPeers []*Peer          // Peers with credits to return
	failed     []*Peer          // Peers failed, for Progress to report

	// qpErrs are the QPs the async events said failed, for Progress
	// (WatchEvents appends; guarded by qpErrMu).
	qpErrMu sync.Mutex
	qpErrs  []qpErr
	// errsNew says qpErrs or devErr changed since Progress last looked
	// (set and cleared under qpErrMu), so that Progress, on the data
	// path, takes the lock only when there is something to apply.
	errsNew atomic.Bool
	// devErr is the event that ended all of the rank's traffic
	// (DEVICE_FATAL, or CQ_ERR of its CQ), valid once dead is closed; set
	// by WatchEvents (guarded by qpErrMu). devApplied says Progress took
	// it and failed every Conn and Peer for it.
	devErr     verbs.EventType
	dead       chan struct{}
	devApplied bool // guarded by qpErrMu

	kick    func()
	dev     *verbs.Context
	log     *slog.Logger
	m       *Metrics
	qps     prometheus.Gauge
	recvKey string

	// setup is the time spent making QPs and changing their states;
	// handshake the time lazy connections took from their Conn's first
	// need to RTS, summed.
	setup, handshake time.Duration

	cancel  context.CancelFunc
	wg      sync.WaitGroup
	stopped bool
	armed   atomic.Bool // the CQ is armed, or its event not yet taken (by WatchCQ or Arm)
}

// NewEndpoint makes the Core of cfg and divides its receive buffers among
// the peers as credits. On error the returned Endpoint is to be freed
// (Free).
func NewEndpoint(cfg EndpointConfig) (*Endpoint, error) {
	e := &Endpoint{name: cfg.Name, magic: cfg.Magic, rank: cfg.Rank, eager: cfg.EagerSize, sendDepth: cfg.SendDepth,
		peers: cfg.Peers, bySend: map[uint32]*Conn{}, byRecv: map[uint32]*Peer{},
		kick: cfg.Kick, dev: cfg.Device, dead: make(chan struct{}), log: cfg.Log, m: cfg.Metrics, qps: cfg.QPs, recvKey: cfg.RecvQPKey}
	if cfg.Rank < 0 || cfg.Rank >= len(cfg.Nodes) || len(cfg.Peers) > len(cfg.Nodes) {
		return e, fmt.Errorf("%s: rank %d and %d peers of a job of %d ranks", e.name, cfg.Rank, len(cfg.Peers), len(cfg.Nodes))
	}
	// Every remote rank gets an equal share of a rank's receive buffers:
	// the credits of a sender toward it, and what it refunds at.
	size := map[int]int{} // ranks by node
	for _, n := range cfg.Nodes {
		size[n]++
	}
	for _, p := range cfg.Peers {
		if p != nil {
			p.Conn.name = cfg.Name
			p.credits, _ = Shares(cfg.SRQDepth, len(cfg.Nodes)-size[cfg.Nodes[p.Rank]])
		}
	}
	e.credits, e.refund = Shares(cfg.SRQDepth, len(cfg.Nodes)-size[cfg.Nodes[cfg.Rank]])
	var err error
	e.Core, err = NewCore(cfg.CoreConfig)
	if err != nil {
		return e, fmt.Errorf("%s: %w", e.name, err)
	}
	e.m.SRQPosted.Set(float64(cfg.SRQDepth))
	return e, nil
}

// Run starts the goroutines that wait for completions and async events;
// the context it returns, for the transport's own goroutines (Go), ends
// at Close.
func (e *Endpoint) Run() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	e.wg.Go(func() { WatchCQ(ctx, e.Core.Ch, &e.armed, e.kick, e.log, e.m) })
	e.wg.Go(func() { WatchEvents(ctx, e.dev, e.Core.Recv, e.Core.CQ, e.qpFailed, e.devFailure, e.kick, e.log, e.m) })
	return ctx
}

// Arm asks for a kick at the next completion (transport.Armer): it arms
// the CQ unless it is armed already or its event has not been taken yet
// (both end in a kick). The caller polls once more before it sleeps.
//
// A rank that sleeps on WakeFD as well may wake for the event before
// WatchCQ reads it (WatchCQ needs a free P, which the ranks may all hold);
// left in the channel, it would end every later sleep at once. So Arm takes
// an event that is there, as WatchCQ would have, and arms again. WatchCQ
// and Arm never take the same event: whichever reads it clears armed (the
// event disarmed the CQ), and the other finds nothing.
//
// Once the device failed (DEVICE_FATAL, or CQ_ERR of the rank's CQ), no
// completion will come and every peer is failed: Arm arms nothing and
// returns nil, and WakeFD is -1. A device that goes away closes the
// completion channel after it queued DEVICE_FATAL (the soft HCA, and the
// kernel when it disassociates a removed device), so an Arm that fails on
// the channel waits a little for WatchEvents to read the event before it
// returns the error.
func (e *Endpoint) Arm() error {
	if e.stopped {
		return e.errClosed("arm")
	}
	if e.isDead() {
		return nil
	}
	if e.armed.Load() {
		cq, err := e.Core.Ch.TryEvent()
		if err != nil {
			return e.armError(err)
		}
		if cq == nil {
			// Armed, with no event yet; or WatchCQ has it and kicks.
			return nil
		}
		e.m.CQEvents.Inc()
		e.armed.Store(false)
	}
	e.armed.Store(true)
	if err := e.Core.CQ.RequestNotify(false); err != nil {
		e.armed.Store(false)
		return e.armError(err)
	}
	return nil
}

// deadWait bounds how long an Arm that failed waits for the device's
// failure event (Arm).
const deadWait = 100 * time.Millisecond

// armError is the error of an Arm that failed with err: nil if the device
// failed (its event came, or comes within deadWait), the rank's next
// Progress failing every peer.
func (e *Endpoint) armError(err error) error {
	select {
	case <-e.dead:
		e.kick()
		return nil
	case <-time.After(deadWait):
		return fmt.Errorf("%s: arm CQ: %w", e.name, err)
	}
}

// isDead reports whether the device failed (devFailure).
func (e *Endpoint) isDead() bool {
	select {
	case <-e.dead:
		return true
	default:
		return false
	}
}

// devFailure records ev, the device's failure (WatchEvents calls it): the
// next Progress fails every Conn and Peer. The first event is the cause,
// except that a DEVICE_FATAL replaces a CQ_ERR that Progress has not
// applied yet: a device that goes away may overrun the CQ with the
// flushes of its work first.
func (e *Endpoint) devFailure(ev verbs.EventType) {
	e.qpErrMu.Lock()
	defer e.qpErrMu.Unlock()
	e.errsNew.Store(true)
	if !e.isDead() {
		e.devErr = ev
		close(e.dead)
	} else if ev == verbs.EventDeviceFatal && !e.devApplied {
		e.devErr = ev
	}
}

// WakeFD is the descriptor of the CQ's completion channel, readable once
// a completion came on the CQ that Arm armed (transport.Armer); -1 once
// the device failed.
func (e *Endpoint) WakeFD() int {
	if e.isDead() {
		return -1
	}
	return e.Core.Ch.FD()
}

// Go runs f in a goroutine that Close waits for.
func (e *Endpoint) Go(f func()) { e.wg.Go(f) }

// errClosed is the error of a call after Close: the QPs and buffers are
// gone.
func (e *Endpoint) errClosed(call string) error {
	return fmt.Errorf("%s: %s after close: %w", e.name, call, net.ErrClosed)
}

// Close ends the context of Run (if Run was called), waits for the
// goroutines and, the first time, calls teardown, which frees what the
// transport made (and the Endpoint: Free).
func (e *Endpoint) Close(teardown func() error) error {
	if e.stopped {
		return nil
	}
	e.stopped = true
	if e.cancel != nil {
		e.cancel()
	}
	e.wg.Wait()
	return teardown()
}

// Free destroys the Conns' QPs and closes the Core. QPs the transport
// made itself (XRC's TGT QPs) are not the Endpoint's: the caller closes
// them before calling Free. Nothing on a nil Endpoint.
func (e *Endpoint) Free() error {
	if e == nil {
		return nil
	}
	var errs []error
	for _, c := range e.conns {
		if c.QP != nil {
			errs = append(errs, c.QP.Close())
			c.QP = nil
			e.qps.Dec()
		}
	}
	if e.Core != nil {
		errs = append(errs, e.Core.Close())
	}
	return errors.Join(errs...)
}

// Reaches reports whether rank is on another node.
func (e *Endpoint) Reaches(rank int) bool {
	return rank >= 0 && rank < len(e.peers) && e.peers[rank] != nil
}

// MaxEager is the size of a receive buffer.
func (e *Endpoint) MaxEager() int { return e.eager }

// Credits is the frames a rank of another node may have unconsumed at this
// one.
func (e *Endpoint) Credits() uint32 { return e.credits }

// Peer is rank, once its record was read.
func (e *Endpoint) Peer(rank int) (*Peer, error) {
	if !e.Reaches(rank) {
		return nil, fmt.Errorf("%w: rank %d", transport.ErrUnreachable, rank)
	}
	p := e.peers[rank]
	if !p.Recorded {
		return nil, fmt.Errorf("%s: rank %d: not connected yet", e.name, rank)
	}
	return p, nil
}

// Usage is what an Endpoint holds, for the transports' Stats.
type Usage struct {
	// Conns is the Conns whose QP was made, Ready those in RTS.
	Conns, Ready int
	// RegisteredBytes is the memory registered: receive and send buffers
	// and the registration cache's regions; CachedRegions the regions of
	// the cache.
	RegisteredBytes int64
	CachedRegions   int
	// QueueBytes estimates the queue memory of the Conns' QPs, the SRQ
	// and the CQ (QueueBytes).
	QueueBytes int64
	// SetupTime is the time spent making QPs and changing their states;
	// HandshakeTime, with lazy connection, the time from a Conn's first
	// need to its QP at RTS, summed.
	SetupTime, HandshakeTime time.Duration
}

// Usage reports the Endpoint's objects and memory.
func (e *Endpoint) Usage() Usage {
	u := Usage{CachedRegions: e.Core.Cache.Entries(), SetupTime: e.setup, HandshakeTime: e.handshake}
	for _, c := range e.conns {
		if c.QP != nil {
			u.Conns++
			if c.state == ConnReady {
				u.Ready++
			}
		}
	}
	u.RegisteredBytes = e.Core.RegisteredBytes()
	u.QueueBytes = e.Core.QueueBytes(u.Conns, e.sendDepth)
	return u
}
