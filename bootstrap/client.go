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
	err    error                 // why the client ended; guarded by mu, set before done closes
	done   chan struct{}
}

type reply struct {
	recs [][]byte
	val  []byte
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
		return nil, fmt.Errorf("bootstrap: join %s: %w", addr, err)
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
	if t == tReject {
		rej, err := expect[*msgReject](t, p, tReject)
		if err != nil {
			return err
		}
		return rejectError(rej)
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
				c.fail(protoErr("malformed", "collective %d: %d records for %d ranks", m.Seq, len(m.Recs), c.size))
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
			c.deliver(c.reqs, m.ID, reply{val: m.Val})
		case *msgAbort:
			c.fail(&AbortError{Rank: int(m.Rank), Lost: m.Lost, Reason: m.Reason})
			return
		default:
			c.fail(protoErr("unexpected", "a %v message from the server", t))
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

// AllGather sends rec and returns every rank's record, indexed by rank.
// Every rank must call it (in the same order among collectives). rec may
// be reused when AllGather returns; the records returned are new memory
// owned by the caller (they share one backing buffer).
func (c *Client) AllGather(ctx context.Context, rec []byte) ([][]byte, error) {
	c.m.calls.WithLabelValues("allgather").Inc()
	if len(rec) > MaxRecord {
		return nil, fmt.Errorf("bootstrap: allgather: a record of %d bytes exceeds %d", len(rec), MaxRecord)
	}
	if c.nc == nil {
		if err := c.localCheck(ctx); err != nil {
			return nil, fmt.Errorf("bootstrap: allgather: %w", err)
		}
		return [][]byte{append([]byte{}, rec...)}, nil
	}
	r, err := c.collective(ctx, kindAllGather, rec)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: allgather: %w", err)
	}
	return r.recs, nil
}

// Barrier returns once every rank has called it.
func (c *Client) Barrier(ctx context.Context) error {
	c.m.calls.WithLabelValues("barrier").Inc()
	if c.nc == nil {
		if err := c.localCheck(ctx); err != nil {
			return fmt.Errorf("bootstrap: barrier: %w", err)
		}
		return nil
	}
	if _, err := c.collective(ctx, kindBarrier, nil); err != nil {
		return fmt.Errorf("bootstrap: barrier: %w", err)
	}
	return nil
}

// Put stores val under key for every rank's Get. A key holds one value:
// putting the same value again is fine, another value fails with
// ErrKeyExists. val may be reused when Put returns.
func (c *Client) Put(ctx context.Context, key string, val []byte) error {
	c.m.calls.WithLabelValues("put").Inc()
	if len(key) > MaxKey || len(val) > MaxRecord {
		return fmt.Errorf("bootstrap: put %q: key of %d bytes or value of %d bytes too long", cut(key, 64), len(key), len(val))
	}
	if c.nc == nil {
		return c.localPut(ctx, key, val)
	}
	r, err := c.request(ctx, func(id uint64) message { return &msgPut{ID: id, Key: key, Val: val} })
	if err == nil {
		err = r.err
	}
	if err != nil {
		return fmt.Errorf("bootstrap: put %q: %w", cut(key, 64), err)
	}
	return nil
}

// Get returns the value put under key, waiting until some rank puts it.
// The value is new memory owned by the caller.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	c.m.calls.WithLabelValues("get").Inc()
	if len(key) > MaxKey {
		return nil, fmt.Errorf("bootstrap: get: a key of %d bytes exceeds %d", len(key), MaxKey)
	}
	if c.nc == nil {
		return c.localGet(ctx, key)
	}
	r, err := c.request(ctx, func(id uint64) message { return &msgGet{ID: id, Key: key} })
	if err != nil {
		return nil, fmt.Errorf("bootstrap: get %q: %w", cut(key, 64), err)
	}
	if r.val == nil {
		r.val = []byte{}
	}
	return r.val, nil
}

// Abort aborts the job: every rank's client, this one's included, ends
// with an *AbortError naming this rank and reason. Abort returns once the
// server has broadcast the abort (or this client has ended otherwise), or
// when ctx ends.
func (c *Client) Abort(ctx context.Context, reason string) error {
	c.m.calls.WithLabelValues("abort").Inc()
	reason = cut(reason, maxReason)
	if c.nc == nil {
		c.fail(&AbortError{Rank: c.me.Rank, Reason: reason})
		return nil
	}
	if err := c.send(ctx, appendFrame(nil, &msgAbort{Rank: int32(c.me.Rank), Reason: reason})); err != nil {
		if errors.Is(err, ErrAborted) {
			return nil
		}
		return fmt.Errorf("bootstrap: abort: %w", err)
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("bootstrap: abort: %w", context.Cause(ctx))
	}
}

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
		c.wmu.Lock()
		c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
		err = c.fc.send(&msgLeave{})
		c.wmu.Unlock()
		if err != nil {
			err = fmt.Errorf("bootstrap: close: leave: %w", err)
		}
	}
	c.fail(ErrClosed)
	return err
}

// collective sends this rank's part of the next collective and waits for
// the result.
func (c *Client) collective(ctx context.Context, kind uint8, rec []byte) (reply, error) {
	if err := ctx.Err(); err != nil {
		return reply{}, err
	}
	ch := make(chan reply, 1)
	c.wmu.Lock()
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		c.wmu.Unlock()
		return reply{}, c.err
	}
	seq := c.seq
	c.seq++
	c.colls[seq] = ch
	c.mu.Unlock()
	err := c.writeLocked(ctx, appendFrame(nil, &msgGather{Seq: seq, Kind: kind, Rec: rec}))
	c.wmu.Unlock()
	return c.wait(ctx, c.colls, seq, ch, err)
}

// request sends a put or get made by mk and waits for its reply.
func (c *Client) request(ctx context.Context, mk func(id uint64) message) (reply, error) {
	if err := ctx.Err(); err != nil {
		return reply{}, err
	}
	ch := make(chan reply, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return reply{}, c.err
	}
	c.nextID++
	id := c.nextID
	c.reqs[id] = ch
	c.mu.Unlock()
	err := c.send(ctx, appendFrame(nil, mk(id)))
	return c.wait(ctx, c.reqs, id, ch, err)
}

// wait waits for the reply to request id, unless sending it failed.
func (c *Client) wait(ctx context.Context, table map[uint64]chan reply, id uint64, ch chan reply, err error) (reply, error) {
	if err == nil {
		select {
		case r := <-ch:
			return r, nil
		case <-ctx.Done():
			err = context.Cause(ctx)
		case <-c.done:
			select {
			case r := <-ch:
				return r, nil
			default:
			}
			err = c.Err()
		}
	}
	c.mu.Lock()
	delete(table, id)
	c.mu.Unlock()
	return reply{}, err
}

// send writes a frame.
func (c *Client) send(ctx context.Context, frame []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.Err(); err != nil {
		return err
	}
	return c.writeLocked(ctx, frame)
}

// writeLocked writes a frame while holding wmu. If ctx ends during the
// write, the write is cut short; the frame may then be half sent, so the
// client ends with ErrLost.
func (c *Client) writeLocked(ctx context.Context, frame []byte) error {
	var mu sync.Mutex
	writing := true
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		if writing {
			c.nc.SetWriteDeadline(time.Unix(1, 0))
		}
		mu.Unlock()
	})
	err := c.fc.write(frame)
	mu.Lock()
	writing = false
	mu.Unlock()
	if !stop() {
		c.nc.SetWriteDeadline(time.Time{})
	}
	if err != nil {
		c.fail(fmt.Errorf("%w: send: %w", ErrLost, err))
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return c.Err()
	}
	return nil
}
