package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

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
	r, err := c.request(ctx, func(id uint64) message { return &msgPut{ID: id, Key: key, Val: val} }, false)
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
	r, err := c.request(ctx, func(id uint64) message { return &msgGet{ID: id, Key: key} }, true)
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

// collective sends this rank's part of the next collective and waits for
// the result: a record per rank for an all-gather, none for a barrier;
// another reply ends the client with a protocol error.
func (c *Client) collective(ctx context.Context, kind uint8, rec []byte) (reply, error) {
	if err := ctx.Err(); err != nil {
		return reply{}, err
	}
	ch := make(chan reply, 1)
	c.wmu.Lock()
	if err := ctx.Err(); err != nil { // it ended while another call wrote
		c.wmu.Unlock()
		return reply{}, err
	}
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
	r, err := c.wait(ctx, c.colls, seq, ch, err)
	bad := len(r.recs) != c.size // an all-gather's
	if kind != kindAllGather {
		bad = r.recs != nil
	}
	if err == nil && bad {
		err = fmt.Errorf("%w: %w", ErrLost, protoErr("malformed", "collective %d (%s): %d records for %d ranks", seq, kindName(kind), len(r.recs), c.size))
		c.fail(err)
	}
	return r, err
}

// request sends a put or get made by mk and waits for its reply, which
// must be a get's answer for a get and a put's for a put: a server that
// answers one with the other is broken, and the client ends with ErrLost
// rather than take a put's answer for an empty value. For a get that ctx
// ends after it was sent, the server is told to forget it, with the next
// frame: a rank that polls for a key with short contexts would otherwise
// leave a getter on the server per try, each of which the server answers
// with the whole value once the key is put.
func (c *Client) request(ctx context.Context, mk func(id uint64) message, get bool) (reply, error) {
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
	sent := err == nil
	r, err := c.wait(ctx, c.reqs, id, ch, err)
	switch {
	case err == nil && r.got != get:
		what := "a put's answer to a get"
		if r.got {
			what = "a get's answer to a put"
		}
		err = fmt.Errorf("%w: %w", ErrLost, protoErr("unexpected", "%s", what))
		c.fail(err)
	case get && sent && err != nil && ctx.Err() != nil && c.Err() == nil:
		c.mu.Lock()
		c.cancels = append(c.cancels, id)
		c.mu.Unlock()
	}
	return r, err
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
	if err := ctx.Err(); err != nil { // it ended while another call wrote
		return err
	}
	return c.writeLocked(ctx, frame)
}

// writeLocked writes a frame while holding wmu. If ctx ends during the
// write, the write is cut short; the frame may then be half sent, so the
// client ends with ErrLost.
func (c *Client) writeLocked(ctx context.Context, frame []byte) error {
	c.mu.Lock()
	if len(c.cancels) > 0 {
		var cf []byte
		for _, id := range c.cancels {
			cf = appendFrame(cf, &msgCancel{ID: id})
		}
		frame = append(cf, frame...)
		c.cancels = c.cancels[:0]
	}
	c.mu.Unlock()
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
