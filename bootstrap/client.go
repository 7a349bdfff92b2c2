package bootstrap

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Member is a rank as it registered.
type Member struct {
	Rank, Node, LocalRank int
	Endpoint              []byte // an opaque record, at most MaxRecord bytes
}

// ClientConfig configures a rank's client.
type ClientConfig struct {
	Logger     *slog.Logger          // nil: discard
	Registerer prometheus.Registerer // nil: none
}

// Client is a rank's connection to the rendezvous server. Its methods are
// safe for concurrent use, but collectives (AllGather, Barrier) must be
// called by every rank in the same order, as MPI's are; concurrent
// collectives on one client are numbered in the order they are sent.
//
// A call whose context ends returns the context's error; what it sent
// stays sent (a cancelled AllGather still counts as this rank's part).
// Once the job is aborted, the server is lost or the client is closed,
// every call fails with Err.
type Client struct {
	me      Member
	size    int
	members []Member
	log     *slog.Logger
	m       *clientMetrics

	nc net.Conn // nil for a world of one
	fc *frameConn

	wmu sync.Mutex // serializes writes, and numbers collectives in the order they are sent

	mu     sync.Mutex
	seq    uint64                // the number of the next collective; guarded by wmu and mu
	nextID uint64                // the last request id; guarded by mu
	colls  map[uint64]chan reply // collectives waiting, by number; guarded by mu
	reqs   map[uint64]chan reply // puts and gets waiting, by id; guarded by mu
	local  map[string][]byte     // a world of one's values; guarded by mu
	lkick  chan struct{}         // closed and replaced on each local put; guarded by mu
	// cancels are the ids of gets whose callers stopped waiting, for the
	// server to forget, sent before the next frame; guarded by mu.
	cancels []uint64
	err     error // why the client ended; guarded by mu, set before done closes
	done    chan struct{}
}

type reply struct {
	recs [][]byte
	val  []byte
	got  bool // a get's answer (msgGot), not a put's
	err  error
}

// Join connects to the server at addr, proves the job's key, registers me
// and returns once every one of the size ranks has registered. Join does
// not keep me.Endpoint. If ctx ends first, Join returns its error.
func Join(ctx context.Context, addr string, key []byte, me Member, size int, cfg ClientConfig) (*Client, error) {
	switch {
	case len(key) < 16:
		return nil, fmt.Errorf("bootstrap: join: the job key must be at least 16 bytes, not %d", len(key))
	case size < 1 || size > math.MaxInt32:
		return nil, fmt.Errorf("bootstrap: join: job size %d out of range", size)
	case me.Rank < 0 || me.Rank >= size:
		return nil, fmt.Errorf("bootstrap: join: rank %d out of range for a job of %d ranks", me.Rank, size)
	case me.Node < 0 || me.Node > math.MaxInt32 || me.LocalRank < 0 || me.LocalRank > math.MaxInt32:
		return nil, fmt.Errorf("bootstrap: join: node %d or local rank %d out of range", me.Node, me.LocalRank)
	case len(me.Endpoint) > MaxRecord:
		return nil, fmt.Errorf("bootstrap: join: an endpoint of %d bytes exceeds %d", len(me.Endpoint), MaxRecord)
	}
	c := newClient(me, size, cfg)
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("bootstrap: join %s: %w", addr, context.Cause(ctx))
		}
		return nil, fmt.Errorf("bootstrap: join %s: %w: %w", addr, ErrLost, err)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	c.nc, c.fc = nc, newFrameConn(nc, c.m.bytesIn, c.m.bytesOut)
	err = c.register(key, me.Endpoint, rand.Reader)
	switch {
	case !stop():
		err = context.Cause(ctx)
	case err == nil, errors.Is(err, ErrAuth), errors.Is(err, ErrProtocol), errors.Is(err, ErrRejected), errors.Is(err, ErrAborted):
	default:
		err = fmt.Errorf("%w: %w", ErrLost, err)
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("bootstrap: join %s as rank %d: %w", addr, me.Rank, err)
	}
	nc.SetDeadline(time.Time{})
	c.log.Debug("bootstrap: joined", "addr", addr, "size", size)
	go c.readLoop()
	return c, nil
}

func newClient(me Member, size int, cfg ClientConfig) *Client {
	return &Client{
		me: Member{Rank: me.Rank, Node: me.Node, LocalRank: me.LocalRank}, size: size,
		log: discard(cfg.Logger).With("rank", me.Rank), m: newClientMetrics(cfg.Registerer),
		colls: map[uint64]chan reply{}, reqs: map[uint64]chan reply{}, done: make(chan struct{}),
	}
}

// register runs the handshake and registration and waits for the member
// table.
func (c *Client) register(key, endpoint []byte, rnd io.Reader) error {
	if err := dialHandshake(c.fc, key, rnd); err != nil {
		return err
	}
	reg := msgRegister{Rank: uint32(c.me.Rank), Size: uint32(c.size), Node: uint32(c.me.Node),
		LocalRank: uint32(c.me.LocalRank), Endpoint: endpoint}
	if err := c.fc.send(&reg); err != nil {
		return err
	}
	t, p, err := c.fc.read(maxFromServer)
	if err != nil {
		return err
	}
	switch t {
	case tReject:
		rej, err := expect[*msgReject](t, p, tReject)
		if err != nil {
			return err
		}
		return rejectError(rej)
	case tAbort: // before every rank joined: one was lost, or the launcher gave up
		a, err := expect[*msgAbort](t, p, tAbort)
		if err != nil {
			return err
		}
		return &AbortError{Rank: int(a.Rank), Lost: a.Lost, Blamed: a.Blamed, Reason: a.Reason}
	}
	ready, err := expect[*msgReady](t, p, tReady)
	if err != nil {
		return err
	}
	if len(ready.Members) != c.size {
		return protoErr("malformed", "a member table of %d ranks for a job of %d", len(ready.Members), c.size)
	}
	c.members = ready.Members
	c.me = c.members[c.me.Rank]
	return nil
}

// readLoop delivers the server's replies until the connection ends.
func (c *Client) readLoop() {
	for {
		t, p, err := c.fc.read(maxFromServer)
		var m message
		if err == nil {
			m, err = decodeMessage(t, p)
		}
		if err != nil {
			c.fail(fmt.Errorf("%w: %w", ErrLost, err))
			return
		}
		switch m := m.(type) {
		case *msgGathered:
			if m.Recs != nil && len(m.Recs) != c.size {
				c.fail(fmt.Errorf("%w: %w", ErrLost, protoErr("malformed", "collective %d: %d records for %d ranks", m.Seq, len(m.Recs), c.size)))
				return
			}
			c.deliver(c.colls, m.Seq, reply{recs: m.Recs})
		case *msgPutDone:
			var err error
			if m.Err != "" {
				err = fmt.Errorf("%w: %s", ErrKeyExists, m.Err)
			}
			c.deliver(c.reqs, m.ID, reply{err: err})
		case *msgGot:
			c.deliver(c.reqs, m.ID, reply{val: m.Val, got: true})
		case *msgAbort:
			c.fail(&AbortError{Rank: int(m.Rank), Lost: m.Lost, Blamed: m.Blamed, Reason: m.Reason})
			return
		default:
			c.fail(fmt.Errorf("%w: %w", ErrLost, protoErr("unexpected", "a %v message from the server", t)))
			return
		}
	}
}

// deliver hands a reply to its waiting call, if it still waits.
func (c *Client) deliver(table map[uint64]chan reply, id uint64, r reply) {
	c.mu.Lock()
	ch := table[id]
	delete(table, id)
	c.mu.Unlock()
	if ch != nil {
		ch <- r
	}
}

// fail ends the client with err, once.
func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.done)
	c.mu.Unlock()
	if c.nc != nil {
		c.nc.Close()
	}
	if !errors.Is(err, ErrClosed) {
		c.log.Error("bootstrap: client ended", "err", err)
	}
}

// Rank returns this rank.
func (c *Client) Rank() int { return c.me.Rank }

// Size returns the number of ranks.
func (c *Client) Size() int { return c.size }

// Members returns the ranks as they registered, indexed by rank. The slice
// is new; the Endpoint records are shared with the client and must not be
// modified.
func (c *Client) Members() []Member { return append([]Member(nil), c.members...) }

// Done returns a channel closed when the client ends: the job was aborted,
// the server was lost, or Close was called. Err then says which.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns nil while the client works, then why it ended: an
// *AbortError, an error wrapping ErrLost, or ErrClosed.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// closeTimeout bounds Close's leave, and a write in progress when Close
// is called.
const closeTimeout = 5 * time.Second

// Close leaves the job cleanly and closes the connection. A rank that
// closes before the others are done with a collective aborts the job, so
// call Barrier before Close at the end, as MPI_Finalize is collective.
// After Close, Done is closed and calls fail with ErrClosed. Close after
// the client already ended returns nil.
func (c *Client) Close() error {
	c.mu.Lock()
	ended := c.err != nil
	c.mu.Unlock()
	if ended {
		return nil
	}
	var err error
	if c.nc != nil {
		// The deadline, set before waiting for wmu, also bounds a write
		// another call is stuck in (a server that stopped reading).
		c.nc.SetWriteDeadline(time.Now().Add(closeTimeout))
		c.wmu.Lock()
		if c.Err() == nil {
			c.nc.SetWriteDeadline(time.Now().Add(closeTimeout))
			err = c.fc.send(&msgLeave{})
		}
		// The client ends before another call (or Close) can write, for
		// the server takes anything after the leave for a bad message.
		c.fail(ErrClosed)
		c.wmu.Unlock()
		if err != nil {
			err = fmt.Errorf("bootstrap: close: leave: %w", err)
		}
	}
	c.fail(ErrClosed)
	return err
}
