package comm

import (
	"context"
	"slices"
	"sync/atomic"
	"time"
)

// The non-blocking collectives, MPI's Ibarrier, Ibcast and the others.
// Each takes its call's turn on the communicator at once, so that the
// calls pair up across the ranks in the order each rank makes them,
// blocking or not, and then hands the collective, the same code as the
// blocking call's, to a worker goroutine, at once if it is large and a
// little later if it is small (handOffAt). The worker drives the rank's
// progress whenever no other goroutine does, so the collective advances
// while the caller computes.
//
// The Request completes when the collective has; Wait, Test, Waitall and
// Waitany take it as they take the point-to-point ones, and Cancel does
// not (it reports false). The buffers belong to the request until then.
// ctx bounds the collective itself: if it ends first, the request
// completes with its error, its buffers as after a failed collective
// (collective.go); the context of a Wait bounds only that wait. A root
// out of range completes the request at once, and Finalize completes
// those still running with ErrFinalized.

// start takes c's next turn and hands body, to run in it, to a worker;
// it returns the request that the body's end completes. size is the bytes
// the call moves from or to this rank: a collective smaller than handOffAt
// is deferred (handOff).
func (c *Comm) start(size int, body func(cc *Comm, tag int) error) *Request {
	cc, tag, err := c.collective()
	if err != nil {
		return c.failed(err)
	}
	r := newRequest(c.e)
	r.coll = job{body: body, c: c, cc: cc, tag: tag, r: r}
	j := &r.coll
	e := c.e
	e.mu.Lock()
	c.jobs++ // Free waits for them
	later := size < handOffAt
	if later {
		e.deferred = append(e.deferred, j)
		e.ndeferred.Store(int32(len(e.deferred)))
		if e.handOffTimer == nil {
			e.handOffTimer = time.AfterFunc(e.handOffDelay, e.handOff)
		} else if !e.handOffArmed {
			e.handOffTimer.Reset(e.handOffDelay)
		}
		e.handOffArmed = true
	}
	e.mu.Unlock()
	if !later {
		e.give(j)
	}
	return r
}

// A worker's hand-off costs a thread's wake-up, several µs here, more
// than a small collective takes: an 8-byte Iallreduce of two ranks that a
// Wait followed took 4.5 µs when it went to a worker at once, against 1 µs
// for Allreduce. So a collective of fewer than handOffAt bytes is
// deferred: the first of these that comes runs it, or hands it to a
// worker.
//   - Wait, with a context that cannot end, runs it itself (waitColl);
//   - Test, Testall and a Wait that can end hand it to a worker;
//   - so does any call of the rank that has to wait for something (await:
//     Waitany, Finalize, a Recv...), as what it waits for may depend on
//     the collective;
//   - so does a timer, handOffDelay after the first deferred collective,
//     (e.handOffDelay, which tests may change),
//     so that a rank that computes without calling comm still takes its
//     part. Go's timers may fire a millisecond late when no P is
//     running, and later when one goroutine holds the only P.
const (
	handOffAt    = 64 << 10
	handOffDelay = 20 * time.Microsecond
)

// handOff gives the deferred collectives that nobody has claimed to
// workers.
func (e *engine) handOff() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, j := range e.deferred {
		if !j.claimed.Load() {
			e.give(j)
		}
	}
	clear(e.deferred)
	e.deferred = e.deferred[:0]
	e.ndeferred.Store(0)
	e.handOffArmed = false
}

// handOffFor hands the deferred collectives to workers if one of reqs
// is among them: its caller tests or waits for it without running it.
func (e *engine) handOffFor(reqs ...*Request) {
	if e.ndeferred.Load() == 0 {
		return
	}
	for _, r := range reqs {
		if r != nil && r.isColl() && !r.coll.claimed.Load() {
			e.handOff()
			return
		}
	}
}

// undefer takes j, which the caller has claimed, from the deferred ones;
// the lock is held.
func (e *engine) undefer(j *job) {
	if i := slices.Index(e.deferred, j); i >= 0 {
		e.deferred = slices.Delete(e.deferred, i, i+1) // which clears the tail
		e.ndeferred.Store(int32(len(e.deferred)))
	}
}

// job is a non-blocking collective's body, run once: by a worker, or by
// Wait if it comes first. It lives in its request.
type job struct {
	claimed atomic.Bool
	body    func(cc *Comm, tag int) error
	c, cc   *Comm // the communicator the call was on, and the one it runs in
	tag     int
	r       *Request
}

// claim reports whether the caller is the one to run the job.
func (j *job) claim() bool { return j.claimed.CompareAndSwap(false, true) }

// do runs the job, claimed, completes its request, and lets go of the
// body (and of the buffers it holds), as the request may live on.
func (j *job) do() {
	body := j.body
	j.body = nil
	err := body(j.cc, j.tag)
	e := j.c.e
	e.mu.Lock()
	j.c.jobs--
	j.r.complete(Status{}, err)
	e.mu.Unlock()
}

// give gives j to an idle worker, or a new one. A worker is a goroutine
// that stays for the next job once it is done, so that a call does not
// pay for a new goroutine and for growing its stack, which the runtime
// copies each time. The workers end at Finalize.
func (e *engine) give(j *job) {
	select {
	case e.work <- j:
	default:
		go e.worker(j)
	}
}

func (e *engine) worker(j *job) {
	for {
		if j.claim() {
			j.do()
		}
		j = nil
		select {
		case j = <-e.work:
		case <-e.finished:
			return
		}
	}
}

// failed returns a request completed with err.
func (c *Comm) failed(err error) *Request {
	r := newRequest(c.e)
	r.complete(Status{}, err)
	return r
}

// Ibarrier starts a Barrier.
func (c *Comm) Ibarrier(ctx context.Context) *Request {
	return c.start(0, func(cc *Comm, tag int) error { return cc.barrier(ctx, tag) })
}

// Ibcast starts a Bcast.
func (c *Comm) Ibcast(ctx context.Context, buf []byte, root int) *Request {
	if err := c.checkRoot(root); err != nil {
		return c.failed(c.refuse(err))
	}
	return c.start(len(buf), func(cc *Comm, tag int) error { return cc.bcast(ctx, tag, buf, root) })
}

// Igather starts a Gather.
func (c *Comm) Igather(ctx context.Context, send, recv []byte, root int) *Request {
	return c.igatherv(ctx, "gather", send, recv, c.equalCounts(len(send)), nil, root)
}

// Igatherv starts a Gatherv.
func (c *Comm) Igatherv(ctx context.Context, send, recv []byte, counts, displs []int, root int) *Request {
	return c.igatherv(ctx, "gatherv", send, recv, counts, displs, root)
}

func (c *Comm) igatherv(ctx context.Context, what string, send, recv []byte, counts, displs []int, root int) *Request {
	if err := c.checkRoot(root); err != nil {
		return c.failed(c.refuse(err))
	}
	return c.start(len(send)+len(recv), func(cc *Comm, tag int) error { return cc.gatherv(ctx, tag, what, send, recv, counts, displs, root) })
}

// Iscatter starts a Scatter.
func (c *Comm) Iscatter(ctx context.Context, send, recv []byte, root int) *Request {
	return c.iscatterv(ctx, "scatter", send, c.equalCounts(len(recv)), nil, recv, root)
}

// Iscatterv starts a Scatterv.
func (c *Comm) Iscatterv(ctx context.Context, send []byte, counts, displs []int, recv []byte, root int) *Request {
	return c.iscatterv(ctx, "scatterv", send, counts, displs, recv, root)
}

func (c *Comm) iscatterv(ctx context.Context, what string, send []byte, counts, displs []int, recv []byte, root int) *Request {
	if err := c.checkRoot(root); err != nil {
		return c.failed(c.refuse(err))
	}
	return c.start(len(send)+len(recv), func(cc *Comm, tag int) error { return cc.scatterv(ctx, tag, what, send, counts, displs, recv, root) })
}

// Iallgather starts an Allgather.
func (c *Comm) Iallgather(ctx context.Context, send, recv []byte) *Request {
	return c.start(len(send)+len(recv), func(cc *Comm, tag int) error { return cc.allgather(ctx, tag, send, recv) })
}

// Iallgatherv starts an Allgatherv.
func (c *Comm) Iallgatherv(ctx context.Context, send, recv []byte, counts, displs []int) *Request {
	return c.start(len(send)+len(recv), func(cc *Comm, tag int) error { return cc.allgatherv(ctx, tag, send, recv, counts, displs) })
}

// Ialltoall starts an Alltoall.
func (c *Comm) Ialltoall(ctx context.Context, send, recv []byte) *Request {
	return c.start(len(send)+len(recv), func(cc *Comm, tag int) error { return cc.alltoallBlocks(ctx, tag, send, recv) })
}

// Ialltoallv starts an Alltoallv.
func (c *Comm) Ialltoallv(ctx context.Context, send []byte, sendCounts, sendDispls []int, recv []byte, recvCounts, recvDispls []int) *Request {
	return c.start(len(send)+len(recv), func(cc *Comm, tag int) error {
		return cc.alltoallv(ctx, tag, send, sendCounts, sendDispls, recv, recvCounts, recvDispls)
	})
}

// Ireduce starts a Reduce.
func Ireduce[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T], root int) *Request {
	if err := c.checkRoot(root); err != nil {
		return c.failed(c.refuse(err))
	}
	return c.start(vecBytes(send, recv), func(cc *Comm, tag int) error { return reduce(ctx, cc, tag, send, recv, op, root) })
}

// Iallreduce starts an Allreduce.
func Iallreduce[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T]) *Request {
	return c.start(vecBytes(send, recv), func(cc *Comm, tag int) error { return allreduce(ctx, cc, tag, send, recv, op) })
}

// IreduceScatter starts a ReduceScatter.
func IreduceScatter[T Number](ctx context.Context, c *Comm, send, recv []T, counts []int, op Op[T]) *Request {
	return c.start(vecBytes(send, recv), func(cc *Comm, tag int) error { return reduceScatter(ctx, cc, tag, send, recv, counts, op) })
}

// IreduceScatterBlock starts a ReduceScatterBlock.
func IreduceScatterBlock[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T]) *Request {
	return IreduceScatter(ctx, c, send, recv, c.equalCounts(blockLen(c, send, recv)), op)
}

// Iscan starts a Scan.
func Iscan[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T]) *Request {
	return c.start(vecBytes(send, recv), func(cc *Comm, tag int) error { return scan(ctx, cc, tag, send, recv, op) })
}

// Iexscan starts an Exscan.
func Iexscan[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T]) *Request {
	return c.start(vecBytes(send, recv), func(cc *Comm, tag int) error { return exscan(ctx, cc, tag, send, recv, op) })
}

// vecBytes is the bytes of send and recv together.
func vecBytes[T Number](send, recv []T) int { return len(Bytes(send)) + len(Bytes(recv)) }
