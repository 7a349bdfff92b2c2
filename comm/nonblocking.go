package comm

import (
	"context"
	"sync/atomic"
)

// The non-blocking collectives, MPI's Ibarrier, Ibcast and the others.
// Each takes its call's turn on the communicator at once, so that the
// calls pair up across the ranks in the order each rank makes them,
// blocking or not, and then hands the collective, the same code as the
// blocking call's, to a worker goroutine. The worker drives the rank's
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
// it returns the request that the body's end completes.
func (c *Comm) start(body func(cc *Comm, tag int) error) *Request {
	cc, tag, err := c.collective()
	if err != nil {
		return c.failed(err)
	}
	r := newRequest(c.e)
	c.e.mu.Lock()
	c.jobs++ // Free waits for them
	c.e.mu.Unlock()
	r.coll = &job{fn: func() {
		err := body(cc, tag)
		c.e.mu.Lock()
		c.jobs--
		r.complete(Status{}, err)
		c.e.mu.Unlock()
	}}
	c.e.run(r.coll)
	return r
}

// job is a non-blocking collective's body, run once: by a worker, or by
// Wait if it comes first.
type job struct {
	claimed atomic.Bool
	fn      func()
}

// claim reports whether the caller is the one to run the job.
func (j *job) claim() bool { return j.claimed.CompareAndSwap(false, true) }

// do runs the job, claimed, and lets go of it (and of the buffers it
// holds), as the request may live on.
func (j *job) do() {
	fn := j.fn
	j.fn = nil
	fn()
}

// run gives j to an idle worker, or a new one. A worker is a goroutine
// that stays for the next job once it is done, so that a call does not
// pay for a new goroutine and for growing its stack, which the runtime
// copies each time. The workers end at Finalize.
func (e *engine) run(j *job) {
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
	return c.start(func(cc *Comm, tag int) error { return cc.barrier(ctx, tag) })
}

// Ibcast starts a Bcast.
func (c *Comm) Ibcast(ctx context.Context, buf []byte, root int) *Request {
	if err := c.checkRoot(root); err != nil {
		return c.failed(err)
	}
	return c.start(func(cc *Comm, tag int) error { return cc.bcast(ctx, tag, buf, root) })
}

// Igather starts a Gather.
func (c *Comm) Igather(ctx context.Context, send, recv []byte, root int) *Request {
	return c.Igatherv(ctx, send, recv, c.equalCounts(len(send)), nil, root)
}

// Igatherv starts a Gatherv.
func (c *Comm) Igatherv(ctx context.Context, send, recv []byte, counts, displs []int, root int) *Request {
	if err := c.checkRoot(root); err != nil {
		return c.failed(err)
	}
	return c.start(func(cc *Comm, tag int) error { return cc.gatherv(ctx, tag, send, recv, counts, displs, root) })
}

// Iscatter starts a Scatter.
func (c *Comm) Iscatter(ctx context.Context, send, recv []byte, root int) *Request {
	return c.Iscatterv(ctx, send, c.equalCounts(len(recv)), nil, recv, root)
}

// Iscatterv starts a Scatterv.
func (c *Comm) Iscatterv(ctx context.Context, send []byte, counts, displs []int, recv []byte, root int) *Request {
	if err := c.checkRoot(root); err != nil {
		return c.failed(err)
	}
	return c.start(func(cc *Comm, tag int) error { return cc.scatterv(ctx, tag, send, counts, displs, recv, root) })
}

// Iallgather starts an Allgather.
func (c *Comm) Iallgather(ctx context.Context, send, recv []byte) *Request {
	return c.start(func(cc *Comm, tag int) error { return cc.allgather(ctx, tag, send, recv) })
}

// Iallgatherv starts an Allgatherv.
func (c *Comm) Iallgatherv(ctx context.Context, send, recv []byte, counts, displs []int) *Request {
	return c.start(func(cc *Comm, tag int) error { return cc.allgatherv(ctx, tag, send, recv, counts, displs) })
}

// Ialltoall starts an Alltoall.
func (c *Comm) Ialltoall(ctx context.Context, send, recv []byte) *Request {
	return c.start(func(cc *Comm, tag int) error { return cc.alltoallBlocks(ctx, tag, send, recv) })
}

// Ialltoallv starts an Alltoallv.
func (c *Comm) Ialltoallv(ctx context.Context, send []byte, sendCounts, sendDispls []int, recv []byte, recvCounts, recvDispls []int) *Request {
	return c.start(func(cc *Comm, tag int) error {
		return cc.alltoallv(ctx, tag, send, sendCounts, sendDispls, recv, recvCounts, recvDispls)
	})
}

// Ireduce starts a Reduce.
func Ireduce[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T], root int) *Request {
	if err := c.checkRoot(root); err != nil {
		return c.failed(err)
	}
	return c.start(func(cc *Comm, tag int) error { return reduce(ctx, cc, tag, send, recv, op, root) })
}

// Iallreduce starts an Allreduce.
func Iallreduce[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T]) *Request {
	return c.start(func(cc *Comm, tag int) error { return allreduce(ctx, cc, tag, send, recv, op) })
}

// IreduceScatter starts a ReduceScatter.
func IreduceScatter[T Number](ctx context.Context, c *Comm, send, recv []T, counts []int, op Op[T]) *Request {
	return c.start(func(cc *Comm, tag int) error { return reduceScatter(ctx, cc, tag, send, recv, counts, op) })
}

// IreduceScatterBlock starts a ReduceScatterBlock.
func IreduceScatterBlock[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T]) *Request {
	return IreduceScatter(ctx, c, send, recv, c.equalCounts(blockLen(c, send, recv)), op)
}

// Iscan starts a Scan.
func Iscan[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T]) *Request {
	return c.start(func(cc *Comm, tag int) error { return scan(ctx, cc, tag, send, recv, op) })
}

// Iexscan starts an Exscan.
func Iexscan[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T]) *Request {
	return c.start(func(cc *Comm, tag int) error { return exscan(ctx, cc, tag, send, recv, op) })
}
