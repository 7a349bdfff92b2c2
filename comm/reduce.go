package comm

import (
	"context"
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// Integer, Float and Number are the element types the reductions take:
// plain values, sent as their bytes in memory, so all the ranks of a job
// must share the machine's byte order (as they do on one kind of CPU).
type (
	Integer interface {
		~int | ~int8 | ~int16 | ~int32 | ~int64 | ~uint | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~uintptr
	}
	Float  interface{ ~float32 | ~float64 }
	Number interface {
		Integer | Float | ~complex64 | ~complex128
	}
)

// Op combines two vectors element by element: dst[i] = a[i] ∘ b[i], where
// a holds the contribution of lower ranks than b's. dst may be a or b. An
// Op must be associative; it need not be commutative, since the
// reductions combine the ranks' contributions in rank order, as MPI's do
// (each result is the same on every rank, to the bit).
type Op[T Number] func(dst, a, b []T)

// Sum adds.
func Sum[T Number](dst, a, b []T) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}

// Prod multiplies.
func Prod[T Number](dst, a, b []T) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] * b[i]
	}
}

// Max keeps the larger (of floats, as the built-in max: NaN if either is).
func Max[T Integer | Float](dst, a, b []T) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = max(a[i], b[i])
	}
}

// Min keeps the smaller (of floats, as the built-in min).
func Min[T Integer | Float](dst, a, b []T) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = min(a[i], b[i])
	}
}

// BitAnd ands bits.
func BitAnd[T Integer](dst, a, b []T) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] & b[i]
	}
}

// BitOr ors bits.
func BitOr[T Integer](dst, a, b []T) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] | b[i]
	}
}

// BitXor exclusive-ors bits.
func BitXor[T Integer](dst, a, b []T) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] ^ b[i]
	}
}

// Bytes returns the memory of s as bytes, without copying, so that
// vectors of numbers go through the calls that take bytes (Send, Recv,
// Bcast, Allgather, …): c.Bcast(ctx, comm.Bytes(v), 0). The bytes are s's
// in this machine's byte order; while a request owns them, s is the
// request's too.
func Bytes[T Number](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

// scratch is the pool of the reductions' scratch vectors, as bytes: the
// element types hold no pointers, so any of them may live there.
var scratch sync.Pool // *[]byte

// getScratch returns a vector of n elements from the pool (its contents
// undefined), and the buffer to give back with putScratch once nothing
// can write it any more (not after an error: a receive into it may still
// be posted).
func getScratch[T Number](n int) ([]T, *[]byte) {
	var z T
	size := n * int(unsafe.Sizeof(z))
	b, _ := scratch.Get().(*[]byte)
	if b == nil || cap(*b) < size {
		// 16 bytes or more: not from the tiny allocator, which packs
		// smaller ones unaligned; aligned to 8 at least, enough for
		// every Number.
		nb := make([]byte, max(size, 16))
		b = &nb
	}
	if n == 0 {
		return nil, b
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(*b))), n), b
}

func putScratch(b *[]byte) {
	if b != nil {
		scratch.Put(b)
	}
}

// errNilOp is the error of a reduction given no Op, which would panic,
// in a worker's goroutine for a non-blocking one, where it ends the
// program.
func errNilOp(what string) error { return fmt.Errorf("comm: %s with a nil Op", what) }

// input is the vector a rank gives a reduction: send, or recv when send
// is nil (the in-place form); an error if they differ in length.
func input[T Number](what string, send, recv []T) ([]T, error) {
	if send == nil {
		return recv, nil
	}
	if len(recv) != len(send) {
		return nil, fmt.Errorf("comm: %s of %d elements into %d", what, len(send), len(recv))
	}
	return send, nil
}

// Reduce combines the send vectors of all the ranks of c with op into
// root's recv, in rank order. recv is used at root only. At root, send
// may be nil: recv then holds root's own vector (MPI_IN_PLACE).
func Reduce[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T], root int) error {
	if err := c.checkRoot(root); err != nil {
		return c.refuse(err)
	}
	return c.run(func(cc *Comm, tag int) error { return reduce(ctx, cc, tag, send, recv, op, root) })
}

// reduce is Reduce on the collective communicator, in the call's tag.
func reduce[T Number](ctx context.Context, cc *Comm, tag int, send, recv []T, op Op[T], root int) error {
	if op == nil {
		return errNilOp("reduce")
	}
	if cc.rank == root && send != nil && len(recv) != len(send) {
		return fmt.Errorf("comm: reduce of %d elements into %d", len(send), len(recv))
	}
	if cc.rank == root && send == nil {
		send = recv
	}
	// A binomial tree toward rank 0, whose subtrees are ranges of ranks:
	// a rank's vector covers the ranks below its children's, so it comes
	// first in op. Rank 0 then passes the result to root. acc is what
	// this rank has: send, then the combinations, in recv at rank 0 when
	// it is root, else in a scratch vector (send is the caller's).
	acc := send
	var tmp, sum []T
	var tmpBuf, sumBuf *[]byte
	for mask := 1; mask < cc.size; mask <<= 1 {
		if cc.rank&mask != 0 {
			if err := cc.Send(ctx, Bytes(acc), cc.rank-mask, tag); err != nil {
				return err
			}
			break
		}
		child := cc.rank | mask
		if child >= cc.size {
			continue
		}
		if tmpBuf == nil {
			tmp, tmpBuf = getScratch[T](len(send))
			sum = recv
			if cc.rank != 0 || root != 0 {
				sum, sumBuf = getScratch[T](len(send))
			}
		}
		if err := cc.recvAll(ctx, "reduce", Bytes(tmp), child, tag); err != nil {
			return err
		}
		op(sum, acc, tmp)
		acc = sum
	}
	var err error
	switch {
	case root == 0:
		if cc.rank == 0 && tmpBuf == nil { // one rank: nothing combined
			copy(recv, send)
		}
	case cc.rank == 0:
		err = cc.Send(ctx, Bytes(acc), root, tag)
	case cc.rank == root:
		err = cc.recvAll(ctx, "reduce", Bytes(recv), 0, tag)
	}
	if err == nil {
		putScratch(tmpBuf)
		putScratch(sumBuf)
	}
	return err
}

// ReduceScatter combines the send vectors of all the ranks of c with op,
// in rank order, as Reduce does, and gives each rank i block i of the
// result: counts[i] elements, after the blocks of the ranks before it.
// send holds the counts' sum, and recv counts[Rank()] elements. send may
// be nil: recv then holds the rank's whole vector and gets its block at
// its start (MPI_IN_PLACE). The result is reduced at rank 0 and scattered
// from there, which any op allows.
func ReduceScatter[T Number](ctx context.Context, c *Comm, send, recv []T, counts []int, op Op[T]) error {
	return c.run(func(cc *Comm, tag int) error { return reduceScatter(ctx, cc, tag, send, recv, counts, op) })
}

// reduceScatter is ReduceScatter on the collective communicator, in the call's tag.
func reduceScatter[T Number](ctx context.Context, cc *Comm, tag int, send, recv []T, counts []int, op Op[T]) error {
	if op == nil {
		return errNilOp("reduce_scatter")
	}
	in := send
	if in == nil {
		in = recv
	}
	if len(counts) != cc.size {
		return fmt.Errorf("comm: reduce_scatter: %d counts for %d ranks", len(counts), cc.size)
	}
	var z T
	size := int(unsafe.Sizeof(z))
	byteCounts := make([]int, len(counts))
	total := 0
	for i, n := range counts {
		if n < 0 || n > (math.MaxInt/size-total) {
			return fmt.Errorf("comm: reduce_scatter: count %d of rank %d (the counts total more than any buffer)", n, i)
		}
		byteCounts[i] = n * size
		total += n
	}
	switch {
	case len(in) != total:
		return fmt.Errorf("comm: reduce_scatter of %d elements: the counts say %d", len(in), total)
	case send != nil && len(recv) != counts[cc.rank]:
		return fmt.Errorf("comm: reduce_scatter into %d elements: this rank's count says %d", len(recv), counts[cc.rank])
	}
	// Rank 0 reduces the whole vector and scatters its blocks.
	var whole []T
	var wholeBuf *[]byte
	var bs [][]byte
	if cc.rank == 0 {
		whole, wholeBuf = getScratch[T](total)
		var err error
		if bs, err = cc.blocks("reduce_scatter", Bytes(whole), byteCounts, nil, false); err != nil {
			return err
		}
	}
	if err := reduce(ctx, cc, tag, in, whole, op, 0); err != nil {
		return err
	}
	out := Bytes(recv[:counts[cc.rank]])
	if cc.rank != 0 {
		return cc.recvAll(ctx, "reduce_scatter", out, 0, tag)
	}
	if err := cc.scatterBlocks(ctx, tag, "reduce_scatter", bs, out); err != nil {
		return err
	}
	putScratch(wholeBuf)
	return nil
}

// ReduceScatterBlock is ReduceScatter with blocks of len(recv) elements
// each (MPI_Reduce_scatter_block): send holds Size() of them. In place
// (send nil), recv holds the Size() blocks and gets the rank's block at
// its start.
func ReduceScatterBlock[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T]) error {
	return ReduceScatter(ctx, c, send, recv, c.equalCounts(blockLen(c, send, recv)), op)
}

// blockLen is the length of ReduceScatterBlock's blocks: recv's, or in
// place a Size()th of it.
func blockLen[T Number](c *Comm, send, recv []T) int {
	if send == nil {
		return len(recv) / c.size
	}
	return len(recv)
}

// Allreduce combines the send vectors of all the ranks of c with op, in
// rank order, into every rank's recv. send may be nil: recv then holds
// the rank's own vector (MPI_IN_PLACE).
func Allreduce[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T]) error {
	return c.run(func(cc *Comm, tag int) error { return allreduce(ctx, cc, tag, send, recv, op) })
}

// allreduce is Allreduce on the collective communicator, in the call's tag.
func allreduce[T Number](ctx context.Context, cc *Comm, tag int, send, recv []T, op Op[T]) error {
	if op == nil {
		return errNilOp("allreduce")
	}
	send, err := input("allreduce", send, recv)
	if err != nil {
		return err
	}
	n, rank := cc.size, cc.rank
	tmp, tmpBuf := getScratch[T](len(recv))
	// in is what this rank has: send, then the combinations, in recv.
	in := send
	// Recursive doubling over p, the largest power of two up to n. The
	// first 2*(n-p) ranks first pair up, the even one of a pair giving
	// its vector to the odd one and sitting out; the others take part
	// with new ranks in the same order, so that at each step a rank and
	// its partner hold the results of two neighbouring ranges of ranks.
	p := 1
	for p*2 <= n {
		p *= 2
	}
	extra := n - p
	nr := rank - extra // new rank
	switch {
	case rank < 2*extra && rank%2 == 0:
		if err := cc.Send(ctx, Bytes(in), rank+1, tag); err != nil {
			return err
		}
		if err := cc.recvAll(ctx, "allreduce", Bytes(recv), rank+1, tag); err != nil {
			return err
		}
		putScratch(tmpBuf)
		return nil
	case rank < 2*extra:
		if err := cc.recvAll(ctx, "allreduce", Bytes(tmp), rank-1, tag); err != nil {
			return err
		}
		op(recv, tmp, in)
		in = recv
		nr = rank / 2
	}
	orig := func(nr int) int { // the rank of new rank nr
		if nr < extra {
			return 2*nr + 1
		}
		return nr + extra
	}
	for mask := 1; mask < p; mask <<= 1 {
		peer := orig(nr ^ mask)
		if err := cc.exchange(ctx, "allreduce", tag, Bytes(in), peer, Bytes(tmp), peer); err != nil {
			return err
		}
		if nr&mask == 0 {
			op(recv, in, tmp)
		} else {
			op(recv, tmp, in)
		}
		in = recv
	}
	if n == 1 {
		copy(recv, send)
	}
	if rank < 2*extra {
		if err := cc.Send(ctx, Bytes(recv), rank-1, tag); err != nil {
			return err
		}
	}
	putScratch(tmpBuf)
	return nil
}

// Scan gives every rank the combination with op, in rank order, of the
// send vectors of ranks 0 to its own (MPI_Scan). send may be nil: recv
// then holds the rank's own vector.
func Scan[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T]) error {
	return c.run(func(cc *Comm, tag int) error { return scan(ctx, cc, tag, send, recv, op) })
}

// scan is Scan on the collective communicator, in the call's tag.
func scan[T Number](ctx context.Context, cc *Comm, tag int, send, recv []T, op Op[T]) error {
	if op == nil {
		return errNilOp("scan")
	}
	send, err := input("scan", send, recv)
	if err != nil {
		return err
	}
	return inclusiveScan(ctx, cc, tag, send, recv, op)
}

// Exscan gives every rank but 0 the combination with op, in rank order,
// of the send vectors of the ranks before it (MPI_Exscan); rank 0's recv
// is left as it was. send may be nil: recv then holds the rank's own
// vector.
func Exscan[T Number](ctx context.Context, c *Comm, send, recv []T, op Op[T]) error {
	return c.run(func(cc *Comm, tag int) error { return exscan(ctx, cc, tag, send, recv, op) })
}

// exscan is Exscan on the collective communicator, in the call's tag.
func exscan[T Number](ctx context.Context, cc *Comm, tag int, send, recv []T, op Op[T]) error {
	if op == nil {
		return errNilOp("exscan")
	}
	send, err := input("exscan", send, recv)
	if err != nil {
		return err
	}
	// The inclusive scan, then each rank's goes to the next: in the same
	// tag as the scan's first round, between the same ranks, after it.
	incl, inclBuf := getScratch[T](len(send))
	if err := inclusiveScan(ctx, cc, tag, send, incl, op); err != nil {
		return err
	}
	dst := cc.rank + 1
	if dst == cc.size {
		dst = -1 // none
	}
	err = cc.exchange(ctx, "exscan", tag, Bytes(incl), dst, Bytes(recv), cc.rank-1)
	if err == nil {
		putScratch(inclBuf)
	}
	return err
}

// inclusiveScan puts into out the combination of the vectors of ranks 0 to this
// one, by recursive doubling: after the round of mask, out holds the
// ranks from this one's less 2*mask-1 (or 0) to this one's, and goes to
// the rank mask above while the one mask below sends its own.
func inclusiveScan[T Number](ctx context.Context, cc *Comm, tag int, send, out []T, op Op[T]) error {
	copy(out, send)
	tmp, tmpBuf := getScratch[T](len(out))
	n, rank := cc.size, cc.rank
	for mask := 1; mask < n; mask <<= 1 {
		dst, src := rank+mask, rank-mask
		if dst >= n {
			dst = -1 // none
		}
		if err := cc.exchange(ctx, "scan", tag, Bytes(out), dst, Bytes(tmp), src); err != nil {
			return err
		}
		if src >= 0 {
			op(out, tmp, out)
		}
	}
	putScratch(tmpBuf)
	return nil
}
