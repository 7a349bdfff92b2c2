package comm

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// Collectives. Every rank of a communicator calls each collective, in the
// same order as the others and with matching sizes and roots, as MPI asks.
// Their messages travel in the communicator's collective context, each
// call with a tag of its own, so they never match a point-to-point
// receive, and two calls never mix: a call that fails its checks on one
// rank still takes its tag there. A rank that finds a size that does not
// match returns an error; the ranks that wait for it wait until their
// context ends. Goroutines that run collectives at the same time need
// communicators of their own (Dup): on one communicator the calls pair up
// in the order each rank makes them.
//
// The caller's buffers are lent to the transports for the call; send and
// recv must not overlap, unless a function says so. After an error the
// call's receives may still be posted, and its sends exposed, as after a
// point-to-point Wait whose context ended: the buffers may still be read
// and written, and a job whose collective fails is best ended (Abort).
//
// The algorithms are the usual ones for short and middling messages:
// dissemination for Barrier, binomial trees for Bcast and Reduce, Bruck's
// for Allgather, recursive doubling for Allreduce and Scan, pairwise
// exchange for Alltoall(v), a ring for Allgatherv, Reduce then Scatterv
// for ReduceScatter; each takes about log2(size) rounds (Alltoall(v) and
// Allgatherv size−1, Gather and Scatter and their vector forms size−1
// messages).

// collective returns the communicator that carries c's collectives and
// the tag of the next one, or why c can take none (a collective of one
// rank sends nothing that would tell).
func (c *Comm) collective() (*Comm, int, error) {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	if err := c.usable(); err != nil {
		return nil, 0, err
	}
	tag := int(c.coll)
	c.coll = (c.coll + 1) & (1<<31 - 1)
	if c.collComm == nil {
		c.collComm = &Comm{e: c.e, ctx: c.ctx | collBit, rank: c.rank, size: c.size, ranks: c.ranks, freed: c.freed}
	}
	return c.collComm, tag, nil
}

// run takes c's next turn and runs body in it, in this goroutine: a
// blocking collective.
func (c *Comm) run(body func(cc *Comm, tag int) error) error {
	cc, tag, err := c.collective()
	if err != nil {
		return err
	}
	return body(cc, tag)
}

// recvAll receives exactly len(buf) bytes from src.
func (c *Comm) recvAll(ctx context.Context, what string, buf []byte, src, tag int) error {
	st, err := c.Recv(ctx, buf, src, tag)
	return checkCount(what, src, st, err, len(buf))
}

// checkCount checks that a receive from src of a collective got the want
// bytes it expected.
func checkCount(what string, src int, st Status, err error, want int) error {
	if err != nil {
		return fmt.Errorf("comm: %s from rank %d: %w", what, src, err)
	}
	if st.Count != want {
		return fmt.Errorf("comm: %s: rank %d sent %d bytes, this rank expected %d", what, src, st.Count, want)
	}
	return nil
}

// exchange sends sbuf to dst while it receives exactly len(rbuf) bytes
// from src (Sendrecv in one tag); a negative dst or src is no peer: only
// the receive, or only the send.
func (c *Comm) exchange(ctx context.Context, what string, tag int, sbuf []byte, dst int, rbuf []byte, src int) error {
	switch {
	case src < 0 && dst < 0:
		return nil
	case src < 0:
		if err := c.Send(ctx, sbuf, dst, tag); err != nil {
			return fmt.Errorf("comm: %s to rank %d: %w", what, dst, err)
		}
		return nil
	case dst < 0:
		return c.recvAll(ctx, what, rbuf, src, tag)
	}
	st, err := c.Sendrecv(ctx, sbuf, dst, tag, rbuf, src, tag)
	if err != nil {
		return fmt.Errorf("comm: %s with ranks %d and %d: %w", what, src, dst, err)
	}
	return checkCount(what, src, st, nil, len(rbuf))
}

func (c *Comm) checkRoot(root int) error { return c.checkPeer(root, "root") }

// refuse takes c's next turn for a collective refused before it started,
// so that the calls after it pair up with the other ranks' (which may
// have accepted theirs), and returns err.
func (c *Comm) refuse(err error) error {
	if _, _, uerr := c.collective(); uerr != nil {
		return uerr
	}
	return err
}

// Barrier returns once every rank of c has called it.
func (c *Comm) Barrier(ctx context.Context) error {
	return c.run(func(cc *Comm, tag int) error { return cc.barrier(ctx, tag) })
}

// barrier is Barrier on the collective communicator, in the call's tag.
func (cc *Comm) barrier(ctx context.Context, tag int) error {
	n := cc.size
	for k := 1; k < n; k <<= 1 {
		if err := cc.exchange(ctx, "barrier", tag, nil, (cc.rank+k)%n, nil, (cc.rank-k+n)%n); err != nil {
			return err
		}
	}
	return nil
}

// Bcast copies root's buf into the buf of every other rank; all pass
// buffers of the same length.
func (c *Comm) Bcast(ctx context.Context, buf []byte, root int) error {
	if err := c.checkRoot(root); err != nil {
		return c.refuse(err)
	}
	return c.run(func(cc *Comm, tag int) error { return cc.bcast(ctx, tag, buf, root) })
}

// bcast is Bcast on the collective communicator, in the call's tag.
func (cc *Comm) bcast(ctx context.Context, tag int, buf []byte, root int) error {
	n := cc.size
	vr := (cc.rank - root + n) % n // rank relative to root
	mask := 1
	for ; mask < n; mask <<= 1 {
		if vr&mask != 0 {
			if err := cc.recvAll(ctx, "bcast", buf, (cc.rank-mask+n)%n, tag); err != nil {
				return err
			}
			break
		}
	}
	// The sends to the children, recycled as Send's are: at most one
	// for each bit of a rank.
	var arr [32]*Request
	reqs := arr[:0]
	defer func() {
		for _, r := range reqs {
			r.release()
		}
	}()
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < n {
			r, err := cc.isend(pooledRequest(cc.e), buf, (cc.rank+mask)%n, tag)
			if err != nil {
				return err
			}
			reqs = append(reqs, r)
		}
	}
	var errs []error
	for _, r := range reqs {
		if _, err := r.Wait(ctx); err != nil {
			errs = append(errs, err)
			if !r.isDone() {
				break // the context ended, or the job
			}
		}
	}
	return errors.Join(errs...)
}

// Gather collects the send buffers of all ranks, of equal length, into
// root's recv, in rank order: rank i's at recv[i*len(send):]. recv is
// used at root only, and must hold exactly Size()*len(send) bytes; root's
// send may be its own block of recv.
func (c *Comm) Gather(ctx context.Context, send, recv []byte, root int) error {
	return c.gathervAs(ctx, "gather", send, recv, c.equalCounts(len(send)), nil, root)
}

// equalCounts is the counts of a vector collective whose blocks are all
// of n bytes.
func (c *Comm) equalCounts(n int) []int {
	counts := make([]int, c.size)
	for i := range counts {
		counts[i] = n
	}
	return counts
}

// Scatter sends the blocks of root's send, in rank order, one to each
// rank's recv: rank i gets send[i*len(recv):]. send is used at root only,
// and must hold exactly Size()*len(recv) bytes.
func (c *Comm) Scatter(ctx context.Context, send, recv []byte, root int) error {
	return c.scattervAs(ctx, "scatter", send, c.equalCounts(len(recv)), nil, recv, root)
}

// Allgather gives every rank the send buffers of all ranks, of equal
// length, in rank order: rank i's at recv[i*len(send):]. recv must hold
// exactly Size()*len(send) bytes; send may be this rank's block of recv.
func (c *Comm) Allgather(ctx context.Context, send, recv []byte) error {
	return c.run(func(cc *Comm, tag int) error { return cc.allgather(ctx, tag, send, recv) })
}

// allgather is Allgather on the collective communicator, in the call's tag.
func (cc *Comm) allgather(ctx context.Context, tag int, send, recv []byte) error {
	n, m := cc.size, len(send)
	if len(recv) != n*m {
		return fmt.Errorf("comm: allgather into %d bytes: %d ranks of %d bytes need %d", len(recv), n, m, n*m)
	}
	// Bruck: recv holds, from its start, the blocks of ranks rank,
	// rank+1, … (mod n), doubling each round; a last rotation puts them
	// in rank order.
	copy(recv, send)
	for k := 1; k < n; k <<= 1 {
		cnt := min(k, n-k)
		if err := cc.exchange(ctx, "allgather", tag, recv[:cnt*m], (cc.rank-k+n)%n, recv[k*m:(k+cnt)*m], (cc.rank+k)%n); err != nil {
			return err
		}
	}
	rotateRight(recv, cc.rank*m)
	return nil
}

// rotateRight rotates b right by s bytes, in place.
func rotateRight(b []byte, s int) {
	if s == 0 || s == len(b) {
		return
	}
	slices.Reverse(b)
	slices.Reverse(b[:s])
	slices.Reverse(b[s:])
}

// Alltoall sends block i of every rank's send to rank i, which receives
// it as block j of its recv, j the sender's rank. send and recv hold
// Size() blocks of equal length each.
func (c *Comm) Alltoall(ctx context.Context, send, recv []byte) error {
	return c.run(func(cc *Comm, tag int) error { return cc.alltoallBlocks(ctx, tag, send, recv) })
}

// alltoallBlocks is Alltoall on the collective communicator, in the call's tag.
func (cc *Comm) alltoallBlocks(ctx context.Context, tag int, send, recv []byte) error {
	n := cc.size
	if len(send) != len(recv) || len(send)%n != 0 {
		return fmt.Errorf("comm: alltoall of %d bytes into %d: both must be %d equal blocks", len(send), len(recv), n)
	}
	m := len(send) / n
	block := func(b []byte) func(r int) []byte {
		return func(r int) []byte { return b[r*m : (r+1)*m] }
	}
	return cc.alltoall(ctx, "alltoall", tag, block(send), block(recv))
}
