package comm

import (
	"context"
	"fmt"
)

// The vector forms of Gather, Scatter and Allgather: the ranks' blocks
// differ in length, counts[i] bytes for rank i, and lie one after another
// in the gathered buffer, rank 0's first (MPI's with displacements that
// are the counts' running sum; other layouts are slices of the caller's).

// checkCounts checks counts against the communicator and returns their
// sum and the offset of each rank's block.
func (c *Comm) checkCounts(what string, counts []int) (int, []int, error) {
	if len(counts) != c.size {
		return 0, nil, fmt.Errorf("comm: %s: %d counts for %d ranks", what, len(counts), c.size)
	}
	offs := make([]int, c.size+1)
	for i, n := range counts {
		if n < 0 {
			return 0, nil, fmt.Errorf("comm: %s: count %d of rank %d", what, n, i)
		}
		offs[i+1] = offs[i] + n
	}
	return offs[c.size], offs, nil
}

// Gatherv collects the send buffers of all ranks into root's recv, rank
// i's counts[i] bytes after those of the ranks before it. counts and recv
// are used at root only; recv must hold the counts' sum.
func (c *Comm) Gatherv(ctx context.Context, send, recv []byte, counts []int, root int) error {
	if err := c.checkRoot(root); err != nil {
		return err
	}
	cc, tag := c.collective()
	if c.rank != root {
		return cc.Send(ctx, send, root, tag)
	}
	total, offs, err := c.checkCounts("gatherv", counts)
	if err != nil {
		return err
	}
	if len(recv) != total || len(send) != counts[c.rank] {
		return fmt.Errorf("comm: gatherv of %d bytes into %d: the counts say %d and %d", len(send), len(recv), counts[c.rank], total)
	}
	copy(recv[offs[c.rank]:], send)
	reqs := make([]*Request, 0, c.size-1)
	for r := range c.size {
		if r != c.rank {
			q, err := cc.Irecv(recv[offs[r]:offs[r+1]], r, tag)
			if err != nil {
				return err
			}
			reqs = append(reqs, q)
		}
	}
	sts, err := Waitall(ctx, reqs...)
	if err != nil {
		return fmt.Errorf("comm: gatherv: %w", err)
	}
	for _, st := range sts {
		if err := checkCount("gatherv", st.Source, st, nil, counts[st.Source]); err != nil {
			return err
		}
	}
	return nil
}

// Scatterv sends rank i counts[i] bytes of root's send, those after the
// blocks of the ranks before it, into its recv, which must be as long.
// send and counts are used at root only; send must hold the counts' sum.
func (c *Comm) Scatterv(ctx context.Context, send []byte, counts []int, recv []byte, root int) error {
	if err := c.checkRoot(root); err != nil {
		return err
	}
	cc, tag := c.collective()
	if c.rank != root {
		return cc.recvAll(ctx, "scatterv", recv, root, tag)
	}
	total, offs, err := c.checkCounts("scatterv", counts)
	if err != nil {
		return err
	}
	if len(send) != total || len(recv) != counts[c.rank] {
		return fmt.Errorf("comm: scatterv of %d bytes into %d: the counts say %d and %d", len(send), len(recv), total, counts[c.rank])
	}
	reqs := make([]*Request, 0, c.size-1)
	for r := range c.size {
		if r != c.rank {
			q, err := cc.Isend(send[offs[r]:offs[r+1]], r, tag)
			if err != nil {
				return err
			}
			reqs = append(reqs, q)
		}
	}
	copy(recv, send[offs[c.rank]:offs[c.rank+1]])
	_, err = Waitall(ctx, reqs...)
	return err
}

// Allgatherv gives every rank the send buffers of all ranks, rank i's
// counts[i] bytes after those of the ranks before it. Every rank passes
// the same counts; recv must hold their sum, and send counts[Rank()]
// bytes.
func (c *Comm) Allgatherv(ctx context.Context, send, recv []byte, counts []int) error {
	cc, tag := c.collective()
	total, offs, err := c.checkCounts("allgatherv", counts)
	if err != nil {
		return err
	}
	if len(recv) != total || len(send) != counts[c.rank] {
		return fmt.Errorf("comm: allgatherv of %d bytes into %d: the counts say %d and %d", len(send), len(recv), counts[c.rank], total)
	}
	// A ring: in step k each rank passes on to the next the block it got
	// in the step before (its own first), the block of rank-k.
	n := c.size
	copy(recv[offs[c.rank]:], send)
	next, prev := (c.rank+1)%n, (c.rank-1+n)%n
	for k := range n - 1 {
		out, in := (c.rank-k+n)%n, (c.rank-k-1+n)%n
		if err := cc.exchange(ctx, "allgatherv", tag, recv[offs[out]:offs[out+1]], next, recv[offs[in]:offs[in+1]], prev); err != nil {
			return err
		}
	}
	return nil
}
