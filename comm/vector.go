package comm

import (
	"cmp"
	"context"
	"fmt"
	"slices"
)

// The vector forms of Gather, Scatter, Allgather and Alltoall: the ranks'
// blocks differ in length, counts[i] bytes for rank i, and lie in the
// gathered (or scattered) buffer at displs[i], as MPI's. With displs nil
// they lie one after another, rank 0's first, and fill the buffer.

// blocks cuts buf into the blocks that counts and displs describe, one per
// rank of c, each capped at its end. Blocks a collective writes (into
// must) may not overlap: two transports would write the same bytes.
func (c *Comm) blocks(what string, buf []byte, counts, displs []int, into bool) ([][]byte, error) {
	if len(counts) != c.size || displs != nil && len(displs) != c.size {
		return nil, fmt.Errorf("comm: %s: %d counts and %d displacements for %d ranks", what, len(counts), len(displs), c.size)
	}
	bs := make([][]byte, c.size)
	off := 0
	for i, n := range counts {
		if n < 0 {
			return nil, fmt.Errorf("comm: %s: count %d of rank %d", what, n, i)
		}
		if displs != nil {
			if n == 0 { // nothing there: its displacement does not matter
				continue
			}
			off = displs[i]
		}
		if off < 0 || off > len(buf) || n > len(buf)-off {
			return nil, fmt.Errorf("comm: %s: rank %d's block of %d bytes at %d lies outside the %d-byte buffer", what, i, n, off, len(buf))
		}
		bs[i] = buf[off : off+n : off+n]
		off += n
	}
	if displs == nil && off != len(buf) {
		return nil, fmt.Errorf("comm: %s: the counts add up to %d bytes, the buffer holds %d", what, off, len(buf))
	}
	if into && displs != nil {
		if err := checkDisjoint(what, displs, counts); err != nil {
			return nil, err
		}
	}
	return bs, nil
}

// checkDisjoint checks that no two non-empty blocks overlap.
func checkDisjoint(what string, displs, counts []int) error {
	order := make([]int, 0, len(counts))
	for i, n := range counts {
		if n > 0 {
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(displs[a], displs[b]) })
	for k := 1; k < len(order); k++ {
		a, b := order[k-1], order[k]
		if displs[a]+counts[a] > displs[b] {
			return fmt.Errorf("comm: %s: the blocks of ranks %d and %d overlap", what, a, b)
		}
	}
	return nil
}

// Gatherv collects the send buffers of all ranks into root's recv, rank
// i's counts[i] bytes at displs[i] (or after those of the ranks before it,
// displs nil, the blocks then filling recv exactly). counts, displs and recv are used at root only, where send
// may be root's own block of recv.
func (c *Comm) Gatherv(ctx context.Context, send, recv []byte, counts, displs []int, root int) error {
	return c.gathervAs(ctx, "gatherv", send, recv, counts, displs, root)
}

// gathervAs is Gatherv, or Gather (what names the call in errors).
func (c *Comm) gathervAs(ctx context.Context, what string, send, recv []byte, counts, displs []int, root int) error {
	if err := c.checkRoot(root); err != nil {
		return c.refuse(err)
	}
	return c.run(func(cc *Comm, tag int) error { return cc.gatherv(ctx, tag, what, send, recv, counts, displs, root) })
}

// gatherv is Gatherv on the collective communicator, in the call's tag;
// what names the call in errors: "gather" for Gather, whose counts are
// all len(send) and whose recv is then too short or too long.
func (cc *Comm) gatherv(ctx context.Context, tag int, what string, send, recv []byte, counts, displs []int, root int) error {
	if cc.rank != root {
		return cc.Send(ctx, send, root, tag)
	}
	if what == "gather" && len(recv) != cc.size*len(send) {
		return fmt.Errorf("comm: gather into %d bytes: %d ranks of %d bytes need %d", len(recv), cc.size, len(send), cc.size*len(send))
	}
	bs, err := cc.blocks(what, recv, counts, displs, true)
	if err != nil {
		return err
	}
	if len(send) != counts[cc.rank] {
		return fmt.Errorf("comm: gatherv: root sends %d bytes, its count says %d", len(send), counts[cc.rank])
	}
	copy(bs[cc.rank], send)
	reqs := make([]*Request, 0, cc.size-1)
	for r, b := range bs {
		if r != cc.rank {
			q, err := cc.Irecv(b, r, tag)
			if err != nil {
				return err
			}
			reqs = append(reqs, q)
		}
	}
	sts, err := Waitall(ctx, reqs...)
	if err != nil {
		return fmt.Errorf("comm: %s: %w", what, err)
	}
	for _, st := range sts {
		if err := checkCount(what, st.Source, st, nil, counts[st.Source]); err != nil {
			return err
		}
	}
	return nil
}

// Scatterv sends rank i the counts[i] bytes of root's send at displs[i]
// (or after the blocks of the ranks before it, displs nil, the blocks then
// filling send exactly) into its recv,
// which must be as long. send, counts and displs are used at root only,
// where the blocks may overlap.
func (c *Comm) Scatterv(ctx context.Context, send []byte, counts, displs []int, recv []byte, root int) error {
	return c.scattervAs(ctx, "scatterv", send, counts, displs, recv, root)
}

// scattervAs is Scatterv, or Scatter (what names the call in errors).
func (c *Comm) scattervAs(ctx context.Context, what string, send []byte, counts, displs []int, recv []byte, root int) error {
	if err := c.checkRoot(root); err != nil {
		return c.refuse(err)
	}
	return c.run(func(cc *Comm, tag int) error { return cc.scatterv(ctx, tag, what, send, counts, displs, recv, root) })
}

// scatterv is Scatterv on the collective communicator, in the call's tag;
// what names the call in errors: "scatter" for Scatter, whose counts are
// all len(recv) and whose send is then too short or too long.
func (cc *Comm) scatterv(ctx context.Context, tag int, what string, send []byte, counts, displs []int, recv []byte, root int) error {
	if cc.rank != root {
		return cc.recvAll(ctx, what, recv, root, tag)
	}
	if what == "scatter" && len(send) != cc.size*len(recv) {
		return fmt.Errorf("comm: scatter of %d bytes: %d ranks of %d bytes need %d", len(send), cc.size, len(recv), cc.size*len(recv))
	}
	bs, err := cc.blocks(what, send, counts, displs, false)
	if err != nil {
		return err
	}
	return cc.scatterBlocks(ctx, tag, what, bs, recv)
}

// scatterBlocks is root's part of Scatterv (and of the collectives that
// end in one, named what), the blocks cut.
func (cc *Comm) scatterBlocks(ctx context.Context, tag int, what string, bs [][]byte, recv []byte) error {
	if len(recv) != len(bs[cc.rank]) {
		return fmt.Errorf("comm: %s: root receives into %d bytes, its count says %d", what, len(recv), len(bs[cc.rank]))
	}
	reqs := make([]*Request, 0, cc.size-1)
	for r, b := range bs {
		if r != cc.rank {
			q, err := cc.Isend(b, r, tag)
			if err != nil {
				return err
			}
			reqs = append(reqs, q)
		}
	}
	copy(recv, bs[cc.rank])
	_, err := Waitall(ctx, reqs...)
	return err
}

// Allgatherv gives every rank the send buffers of all ranks, rank i's
// counts[i] bytes at displs[i] of recv (or after those of the ranks before
// it, displs nil, the blocks then filling recv exactly). Every rank
// passes the same counts and displs; send
// holds counts[Rank()] bytes, and may be this rank's block of recv.
func (c *Comm) Allgatherv(ctx context.Context, send, recv []byte, counts, displs []int) error {
	return c.run(func(cc *Comm, tag int) error { return cc.allgatherv(ctx, tag, send, recv, counts, displs) })
}

// allgatherv is Allgatherv on the collective communicator, in the call's tag.
func (cc *Comm) allgatherv(ctx context.Context, tag int, send, recv []byte, counts, displs []int) error {
	bs, err := cc.blocks("allgatherv", recv, counts, displs, true)
	if err != nil {
		return err
	}
	if len(send) != counts[cc.rank] {
		return fmt.Errorf("comm: allgatherv: this rank sends %d bytes, its count says %d", len(send), counts[cc.rank])
	}
	// A ring: in step k each rank passes on to the next the block it got
	// in the step before (its own first), the block of rank-k.
	n := cc.size
	copy(bs[cc.rank], send)
	next, prev := (cc.rank+1)%n, (cc.rank-1+n)%n
	for k := range n - 1 {
		out, in := (cc.rank-k+n)%n, (cc.rank-k-1+n)%n
		if err := cc.exchange(ctx, "allgatherv", tag, bs[out], next, bs[in], prev); err != nil {
			return err
		}
	}
	return nil
}

// Alltoallv sends to each rank i the sendCounts[i] bytes of send at
// sendDispls[i]; rank i's block for this one arrives in the
// recvCounts[i] bytes of recv at recvDispls[i]. Nil displacements lay the
// blocks one after another, filling the buffer. What rank j sends to rank
// i must be as long as what i expects from j.
func (c *Comm) Alltoallv(ctx context.Context, send []byte, sendCounts, sendDispls []int, recv []byte, recvCounts, recvDispls []int) error {
	return c.run(func(cc *Comm, tag int) error {
		return cc.alltoallv(ctx, tag, send, sendCounts, sendDispls, recv, recvCounts, recvDispls)
	})
}

// alltoallv is Alltoallv on the collective communicator, in the call's tag.
func (cc *Comm) alltoallv(ctx context.Context, tag int, send []byte, sendCounts, sendDispls []int, recv []byte, recvCounts, recvDispls []int) error {
	sb, err := cc.blocks("alltoallv", send, sendCounts, sendDispls, false)
	if err != nil {
		return err
	}
	rb, err := cc.blocks("alltoallv", recv, recvCounts, recvDispls, true)
	if err != nil {
		return err
	}
	return cc.alltoall(ctx, "alltoallv", tag, func(r int) []byte { return sb[r] }, func(r int) []byte { return rb[r] })
}

// alltoall is Alltoall's and Alltoallv's pairwise exchange, of the blocks
// sb(r) to and rb(r) from each rank r: in step k each rank sends to the
// rank k above it and receives from the one k below.
func (cc *Comm) alltoall(ctx context.Context, what string, tag int, sb, rb func(r int) []byte) error {
	n, rank := cc.size, cc.rank
	if len(sb(rank)) != len(rb(rank)) {
		return fmt.Errorf("comm: %s: this rank sends itself %d bytes and expects %d", what, len(sb(rank)), len(rb(rank)))
	}
	copy(rb(rank), sb(rank))
	for k := 1; k < n; k++ {
		dst, src := (rank+k)%n, (rank-k+n)%n
		if err := cc.exchange(ctx, what, tag, sb(dst), dst, rb(src), src); err != nil {
			return err
		}
	}
	return nil
}
