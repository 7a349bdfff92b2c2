package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// collSizes are the per-rank sizes the collective tests use: empty, small
// (eager) and larger than the eager limit (rendezvous).
var collSizes = []int{0, 13, 20000}

// TestCollectives runs every collective on 5 ranks (not a power of two)
// on every layout, from two roots, for each size.
func TestCollectives(t *testing.T) {
	onLayouts(t, func(t *testing.T, l layout) {
		testCollectives(t, worldOn(t, 5, l))
	})
}

// TestCollectivesSizes runs them on one node for 1, 2, 3, 4, 7 and 8 ranks.
func TestCollectivesSizes(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 7, 8} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { testCollectives(t, world(t, n, nil)) })
	}
}

func testCollectives(t *testing.T, comms []*Comm) {
	n := len(comms)
	// The subtests share the ranks: after a failure, the ranks' calls no
	// longer pair up, and the rest would only wait.
	run := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}
	roots := []int{0, min(3, n-1)}
	run("Barrier", func(t *testing.T) {
		var entered atomic.Int32
		each(t, comms, func(ctx context.Context, c *Comm) error {
			for round := range 3 {
				// The last rank comes late: nobody may leave before it.
				if c.Rank() == n-1 {
					time.Sleep(20 * time.Millisecond)
				}
				entered.Add(1)
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				if got := entered.Load(); got < int32(n*(round+1)) {
					return fmt.Errorf("round %d: left the barrier when %d of %d had entered", round, got, n*(round+1))
				}
				if err := c.Barrier(ctx); err != nil { // all have read entered
					return err
				}
			}
			return nil
		})
	})
	for _, size := range collSizes {
		for _, root := range roots {
			run(fmt.Sprintf("Bcast/%dB/root%d", size, root), func(t *testing.T) {
				each(t, comms, func(ctx context.Context, c *Comm) error {
					buf := make([]byte, size)
					if c.Rank() == root {
						buf = pattern(root, size)
					}
					if err := c.Bcast(ctx, buf, root); err != nil {
						return err
					}
					if !bytes.Equal(buf, pattern(root, size)) {
						return errors.New("bcast: wrong bytes")
					}
					return nil
				})
			})
		}
		run(fmt.Sprintf("Alltoall/%dB", size), func(t *testing.T) {
			block := func(from, to int) []byte { return pattern(from*100+to, size) }
			each(t, comms, func(ctx context.Context, c *Comm) error {
				var send []byte
				for r := range n {
					send = append(send, block(c.Rank(), r)...)
				}
				recv := make([]byte, n*size)
				if err := c.Alltoall(ctx, send, recv); err != nil {
					return err
				}
				for r := range n {
					if !bytes.Equal(recv[r*size:(r+1)*size], block(r, c.Rank())) {
						return fmt.Errorf("alltoall: block from %d wrong", r)
					}
				}
				return nil
			})
		})
		elems := size / 8
		for _, root := range roots {
			run(fmt.Sprintf("Reduce/%dB/root%d", size, root), func(t *testing.T) {
				each(t, comms, func(ctx context.Context, c *Comm) error {
					return checkReduce(ctx, c, elems, func(ctx context.Context, send, recv []int64, op Op[int64], inPlace bool) (int, int, error) {
						if inPlace && c.Rank() == root {
							copy(recv, send)
							send = nil
						}
						err := Reduce(ctx, c, send, recv, op, root)
						if c.Rank() != root {
							return 0, 0, err
						}
						return 0, len(recv), err
					})
				})
			})
		}
		run(fmt.Sprintf("Allreduce/%dB", size), func(t *testing.T) {
			each(t, comms, func(ctx context.Context, c *Comm) error {
				return checkReduce(ctx, c, elems, func(ctx context.Context, send, recv []int64, op Op[int64], inPlace bool) (int, int, error) {
					if inPlace {
						copy(recv, send)
						send = nil
					}
					return 0, len(recv), Allreduce(ctx, c, send, recv, op)
				})
			})
		})
	}
	for _, size := range collSizes {
		for _, excl := range []bool{false, true} {
			name := "Scan"
			if excl {
				name = "Exscan"
			}
			run(fmt.Sprintf("%s/%dB", name, size), func(t *testing.T) {
				each(t, comms, func(ctx context.Context, c *Comm) error {
					return checkScan(ctx, c, size/8, excl)
				})
			})
		}
	}
	for _, size := range collSizes {
		for _, layout := range blockLayouts {
			testBlocks(t, run, comms, roots, size, layout)
		}
		run(fmt.Sprintf("Alltoallv/%dB", size), func(t *testing.T) { testAlltoallv(t, comms, size) })
		run(fmt.Sprintf("ReduceScatter/%dB", size), func(t *testing.T) {
			each(t, comms, func(ctx context.Context, c *Comm) error { return checkReduceScatter(ctx, c, size/8) })
		})
	}
	run("AllreduceFloat", func(t *testing.T) {
		// Sums of floats depend on their order: every rank gets the same
		// bits, those of the sum in rank order.
		got := make([][]float64, n)
		each(t, comms, func(ctx context.Context, c *Comm) error {
			send := make([]float64, 100)
			for i := range send {
				send[i] = math.Pow(10, float64((c.Rank()*7+i)%19-9)) * (1 + float64(i)/3)
			}
			got[c.Rank()] = make([]float64, len(send))
			return Allreduce(ctx, c, send, got[c.Rank()], Sum)
		})
		for r := 1; r < n; r++ {
			if !slices.Equal(got[r], got[0]) {
				t.Fatalf("rank %d's sum differs from rank 0's", r)
			}
		}
	})
}

// blockLayouts are the ways testBlocks lays out the ranks' blocks: the
// plain collectives (equal blocks in rank order), the vector forms with
// blocks of different lengths one after another (no displacements), and
// with the blocks in reverse rank order and gaps between them.
var blockLayouts = []string{"", "v", "v-displs"}

// testBlocks runs Gather, Scatter and Allgather with blocks of size
// bytes, or their vector forms with blocks of different lengths around
// size, rank 0's empty.
func testBlocks(t *testing.T, run func(string, func(*testing.T)), comms []*Comm, roots []int, size int, layout string) {
	n := len(comms)
	counts := make([]int, n)
	for i := range counts {
		counts[i] = size
		if layout != "" {
			counts[i] = size*(i%3)/2 + i
		}
	}
	block := func(r int) []byte { return pattern(r+11, counts[r]) }
	var displs []int
	var all []byte // the gathered buffer
	if layout == "v-displs" {
		displs = make([]int, n)
		for r := n - 1; r >= 0; r-- {
			displs[r] = len(all)
			all = append(all, block(r)...)
			all = append(all, gap...)
		}
	} else {
		for r := range n {
			all = append(all, block(r)...)
		}
	}
	// into is a buffer to gather into, its gaps filled as all's are.
	into := func() []byte { return bytes.Repeat(gap[:1], len(all)) }
	vector := layout != ""
	for _, root := range roots {
		run(fmt.Sprintf("Gather%s/%dB/root%d", layout, size, root), func(t *testing.T) {
			each(t, comms, func(ctx context.Context, c *Comm) error {
				var recv []byte
				if c.Rank() == root {
					recv = into()
				}
				var err error
				if vector {
					err = c.Gatherv(ctx, block(c.Rank()), recv, counts, displs, root)
				} else {
					err = c.Gather(ctx, block(c.Rank()), recv, root)
				}
				if err != nil {
					return err
				}
				if c.Rank() == root && !bytes.Equal(recv, all) {
					return errors.New("wrong bytes gathered")
				}
				return nil
			})
		})
		run(fmt.Sprintf("Scatter%s/%dB/root%d", layout, size, root), func(t *testing.T) {
			each(t, comms, func(ctx context.Context, c *Comm) error {
				var send []byte
				if c.Rank() == root {
					send = all
				}
				recv := make([]byte, counts[c.Rank()])
				var err error
				if vector {
					err = c.Scatterv(ctx, send, counts, displs, recv, root)
				} else {
					err = c.Scatter(ctx, send, recv, root)
				}
				if err != nil {
					return err
				}
				if !bytes.Equal(recv, block(c.Rank())) {
					return errors.New("wrong bytes scattered")
				}
				return nil
			})
		})
	}
	run(fmt.Sprintf("Allgather%s/%dB", layout, size), func(t *testing.T) {
		each(t, comms, func(ctx context.Context, c *Comm) error {
			recv := into()
			var err error
			if vector {
				err = c.Allgatherv(ctx, block(c.Rank()), recv, counts, displs)
			} else {
				err = c.Allgather(ctx, block(c.Rank()), recv)
			}
			if err != nil {
				return err
			}
			if !bytes.Equal(recv, all) {
				return errors.New("wrong bytes allgathered")
			}
			return nil
		})
	})
}

// gap is what lies between the blocks of a layout with displacements:
// a collective must leave it alone.
var gap = []byte{0xee, 0xee, 0xee}

// testAlltoallv runs Alltoallv with blocks of a length that depends on
// both ranks (some empty), sent from blocks one after another and
// received into blocks in reverse rank order with gaps; then the other
// way round.
func testAlltoallv(t *testing.T, comms []*Comm, size int) {
	n := len(comms)
	count := func(from, to int) int { return (from+2*to)%4*size/3 + (from+to)%2 }
	block := func(from, to int) []byte { return pattern(from*100+to, count(from, to)) }
	// laid returns the counts of blocks, displacements in reverse order
	// with gaps, the buffer they fill and the gaps' bytes; packed leaves
	// displs nil.
	lay := func(blockOf func(r int) []byte, packed bool) (counts, displs []int, buf []byte) {
		counts = make([]int, n)
		if !packed {
			displs = make([]int, n)
		}
		for k := range n {
			r := k
			if !packed {
				r = n - 1 - k
				displs[r] = len(buf)
			}
			b := blockOf(r)
			counts[r] = len(b)
			buf = append(buf, b...)
			if !packed {
				buf = append(buf, gap...)
			}
		}
		return counts, displs, buf
	}
	for _, sendPacked := range []bool{true, false} {
		each(t, comms, func(ctx context.Context, c *Comm) error {
			me := c.Rank()
			sc, sd, send := lay(func(r int) []byte { return block(me, r) }, sendPacked)
			rc, rd, want := lay(func(r int) []byte { return block(r, me) }, !sendPacked)
			recv := bytes.Repeat(gap[:1], len(want))
			if err := c.Alltoallv(ctx, send, sc, sd, recv, rc, rd); err != nil {
				return err
			}
			if !bytes.Equal(recv, want) {
				return fmt.Errorf("alltoallv (send packed %v): wrong bytes", sendPacked)
			}
			return nil
		})
	}
}

// keepFirst and keepLast are associative operations that are not
// commutative: the result tells the order the operands came in.
func keepFirst(dst, a, b []int64) { copy(dst, a) }
func keepLast(dst, a, b []int64)  { copy(dst, b) }

// opCase is an operation a reduction test runs, and the element i it
// wants.
type opCase struct {
	name string
	op   Op[int64]
	want func(i int64) int64
}

// checkReduce runs reduce (Reduce, Allreduce, ReduceScatter) with Sum,
// Max and two associative operations that are not commutative, keeping
// the first or the last operand, out of place and in place, and checks
// the elements of recv that get a result, [lo, hi): the rank-ordered
// reduction.
func checkReduce(ctx context.Context, c *Comm, elems int, reduce func(ctx context.Context, send, recv []int64, op Op[int64], inPlace bool) (lo, hi int, err error)) error {
	n := int64(c.Size())
	ops := []opCase{
		{"sum", Sum[int64], func(i int64) int64 { return n*i + n*(n-1)/2*1000 }},
		{"max", Max[int64], func(i int64) int64 { return i + (n-1)*1000 }},
		{"first", keepFirst, func(i int64) int64 { return i }},
		{"last", keepLast, func(i int64) int64 { return i + (n-1)*1000 }},
	}
	for _, o := range ops {
		for _, inPlace := range []bool{false, true} {
			send := make([]int64, elems)
			for i := range send {
				send[i] = int64(i) + int64(c.Rank())*1000
			}
			orig := slices.Clone(send)
			recv := make([]int64, elems)
			lo, hi, err := reduce(ctx, send, recv, o.op, inPlace)
			if err != nil {
				return fmt.Errorf("%s: %w", o.name, err)
			}
			if !slices.Equal(send, orig) {
				return fmt.Errorf("%s: the send vector changed", o.name)
			}
			for i := lo; i < hi; i++ {
				if recv[i] != o.want(int64(i)) {
					return fmt.Errorf("%s (in place %v): element %d is %d, want %d", o.name, inPlace, i, recv[i], o.want(int64(i)))
				}
			}
		}
	}
	return nil
}

// checkReduceScatter runs ReduceScatter, with blocks of different lengths
// around elems (rank 0's empty), and ReduceScatterBlock, out of place and
// in place, with the ops of checkReduce, and checks each rank's block.
func checkReduceScatter(ctx context.Context, c *Comm, elems int) error {
	n := c.Size()
	counts := make([]int, n)
	offs := make([]int, n+1)
	for i := range counts {
		counts[i] = elems*(i%3)/2 + i
		offs[i+1] = offs[i] + counts[i]
	}
	for _, block := range []bool{false, true} {
		if block {
			for i := range counts {
				counts[i] = elems
				offs[i+1] = offs[i] + elems
			}
		}
		me := c.Rank()
		err := checkReduce(ctx, c, offs[n], func(ctx context.Context, send, recv []int64, op Op[int64], inPlace bool) (int, int, error) {
			// recv is as long as the whole vector: the rank's block goes
			// to its part of it, where the check looks.
			out := recv[offs[me]:offs[me+1]]
			var err error
			switch {
			case inPlace:
				copy(recv, send)
				if block {
					err = ReduceScatterBlock(ctx, c, nil, recv, op)
				} else {
					err = ReduceScatter(ctx, c, nil, recv, counts, op)
				}
				copy(out, recv[:counts[me]])
			case block:
				err = ReduceScatterBlock(ctx, c, send, out, op)
			default:
				err = ReduceScatter(ctx, c, send, out, counts, op)
			}
			return offs[me], offs[me+1], err
		})
		if err != nil {
			return fmt.Errorf("block %v: %w", block, err)
		}
	}
	return nil
}

// checkScan runs Scan (or Exscan) with Sum and with the operations that
// keep the first or the last operand, out of place and in place, and
// checks that rank r gets the reduction of ranks 0 to r (to r-1) in rank
// order; Exscan leaves rank 0's recv alone.
func checkScan(ctx context.Context, c *Comm, elems int, excl bool) error {
	r := int64(c.Rank())
	upto := r // the last rank combined
	if excl {
		upto--
	}
	ops := []opCase{
		{"sum", Sum[int64], func(i int64) int64 { return (upto+1)*i + upto*(upto+1)/2*1000 }},
		{"first", keepFirst, func(i int64) int64 { return i }},
		{"last", keepLast, func(i int64) int64 { return i + upto*1000 }},
	}
	for _, o := range ops {
		for _, inPlace := range []bool{false, true} {
			send := make([]int64, elems)
			for i := range send {
				send[i] = int64(i) + r*1000
			}
			orig := slices.Clone(send)
			recv := make([]int64, elems)
			for i := range recv {
				recv[i] = -7
			}
			var err error
			f := Scan[int64]
			if excl {
				f = Exscan[int64]
			}
			if inPlace {
				copy(recv, send)
				err = f(ctx, c, nil, recv, o.op)
			} else {
				err = f(ctx, c, send, recv, o.op)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", o.name, err)
			}
			if !slices.Equal(send, orig) {
				return fmt.Errorf("%s: the send vector changed", o.name)
			}
			for i := range recv {
				want := o.want(int64(i))
				if excl && r == 0 {
					want = -7 // left alone
					if inPlace {
						want = orig[i]
					}
				}
				if recv[i] != want {
					return fmt.Errorf("%s (in place %v): element %d is %d, want %d", o.name, inPlace, i, recv[i], want)
				}
			}
		}
	}
	return nil
}

// TestCollectiveSizeMismatch: a rank whose buffer does not match what
// comes gets an error; bad lengths are refused before anything is sent,
// and a call refused on one rank alone still takes its turn there, so
// that the next calls pair up.
func TestCollectiveSizeMismatch(t *testing.T) {
	comms := world(t, 3, nil)
	// Rank 1 expects 8 bytes, then 32, of root's 16.
	for _, size := range []int{8, 32} {
		errs := make([]error, 3)
		each(t, comms, func(ctx context.Context, c *Comm) error {
			buf := pattern(1, 16)
			if c.Rank() == 1 {
				buf = make([]byte, size)
			}
			errs[c.Rank()] = c.Bcast(ctx, buf, 0)
			return nil
		})
		if errs[0] != nil || errs[1] == nil || size == 8 && !errors.Is(errs[1], ErrTruncate) {
			t.Errorf("bcast of 16 bytes, into %d at rank 1: %v", size, errs)
		}
	}
	// Root's recv is too short: its Gather fails, the others' send.
	// The next Gather must gather the next call's blocks.
	each(t, comms, func(ctx context.Context, c *Comm) error {
		var recv []byte
		if c.Rank() == 0 {
			recv = make([]byte, 2)
		}
		err := c.Gather(ctx, []byte{'A'}, recv, 0)
		if (err == nil) != (c.Rank() != 0) {
			return fmt.Errorf("gather into 2 bytes: %v", err)
		}
		if c.Rank() == 0 {
			recv = make([]byte, 3)
		}
		if err := c.Gather(ctx, []byte{'B'}, recv, 0); err != nil {
			return err
		}
		if c.Rank() == 0 && string(recv) != "BBB" {
			return fmt.Errorf("gathered %q after the failed call, want BBB", recv)
		}
		return nil
	})
	// A bad color fails the rank's Split, and counts as Undefined for
	// the others.
	each(t, comms, func(ctx context.Context, c *Comm) error {
		color := 0
		if c.Rank() == 0 {
			color = -5
		}
		n, err := c.Split(ctx, color, 0)
		if c.Rank() == 0 {
			if err == nil || n != nil {
				return fmt.Errorf("split with color -5: %v, %v", n, err)
			}
			return c.Barrier(ctx)
		}
		if err != nil {
			return err
		}
		if n.Size() != 2 {
			return fmt.Errorf("split: size %d, want 2", n.Size())
		}
		return c.Barrier(ctx)
	})
	ctx := context.Background()
	c := comms[0]
	for what, err := range map[string]error{
		"allgather into 4 bytes":                    c.Allgather(ctx, make([]byte, 4), make([]byte, 4)),
		"alltoall of 5 bytes on 3 ranks":            c.Alltoall(ctx, make([]byte, 5), make([]byte, 5)),
		"bcast from rank 3 of 3":                    c.Bcast(ctx, nil, 3),
		"allreduce of 3 elements into 2":            Allreduce(ctx, c, make([]int32, 3), make([]int32, 2), Sum),
		"reduce at root of 3 elements into 2":       Reduce(ctx, c, make([]int32, 3), make([]int32, 2), Sum, 0),
		"gatherv with 2 counts for 3 ranks":         c.Gatherv(ctx, nil, nil, []int{0, 0}, nil, 0),
		"allgatherv with a negative count":          c.Allgatherv(ctx, nil, nil, []int{0, -1, 1}, nil),
		"scatterv of 1 byte, counts of 2":           c.Scatterv(ctx, []byte{1}, []int{0, 1, 1}, nil, nil, 0),
		"gatherv with 2 displacements":              c.Gatherv(ctx, nil, nil, []int{0, 0, 0}, []int{0, 0}, 0),
		"gatherv with a block past the end":         c.Gatherv(ctx, []byte{1}, make([]byte, 4), []int{1, 1, 1}, []int{0, 1, 4}, 0),
		"gatherv with a negative displacement":      c.Gatherv(ctx, []byte{1}, make([]byte, 4), []int{1, 1, 1}, []int{0, -1, 2}, 0),
		"allgatherv into overlapping blocks":        c.Allgatherv(ctx, []byte{1, 2}, make([]byte, 6), []int{2, 2, 2}, []int{0, 3, 2}),
		"alltoallv sending itself 1 byte of 2":      c.Alltoallv(ctx, []byte{1}, []int{1, 0, 0}, nil, []byte{1, 2}, []int{2, 0, 0}, nil),
		"reduce_scatter of 3 elements, counts of 4": ReduceScatter(ctx, c, make([]int32, 3), make([]int32, 1), []int{1, 1, 2}, Sum),
		"reduce_scatter into 2 elements, count 1":   ReduceScatter(ctx, c, make([]int32, 3), make([]int32, 2), []int{1, 1, 1}, Sum),
	} {
		if err == nil {
			t.Errorf("%s: no error", what)
		}
	}
	// Gather and Scatter name themselves, and the buffer they were given,
	// not the vector forms they share code with and whose counts the
	// caller never saw.
	waitErr := func(r *Request) error { _, err := r.Wait(ctx); return err }
	for what, c := range map[string]struct {
		err  error
		want string
	}{
		"gather into 5 bytes":  {c.Gather(ctx, make([]byte, 2), make([]byte, 5), 0), "comm: gather into 5 bytes: 3 ranks of 2 bytes need 6"},
		"igather into 5 bytes": {waitErr(c.Igather(ctx, make([]byte, 2), make([]byte, 5), 0)), "comm: gather into 5 bytes"},
		"scatter of 5 bytes":   {c.Scatter(ctx, make([]byte, 5), make([]byte, 2), 0), "comm: scatter of 5 bytes: 3 ranks of 2 bytes need 6"},
		"iscatter of 7 bytes":  {waitErr(c.Iscatter(ctx, make([]byte, 7), make([]byte, 2), 0)), "comm: scatter of 7 bytes"},
		"gatherv into 5 bytes": {c.Gatherv(ctx, make([]byte, 2), make([]byte, 5), []int{2, 2, 2}, nil, 0), "comm: gatherv: rank 2's block of 2 bytes at 4 lies outside the 5-byte buffer"},
		"scatterv of 5 bytes":  {c.Scatterv(ctx, make([]byte, 5), []int{2, 2, 2}, nil, make([]byte, 2), 0), "comm: scatterv: rank 2's block of 2 bytes at 4 lies outside the 5-byte buffer"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", what, c.err, c.want)
		}
	}
}

// BenchmarkAllreduce sums vectors of float64s over 2 ranks of one node,
// goroutines of this process (bench/coll measures ranks as processes).
func BenchmarkAllreduce(b *testing.B) {
	benchAllreduce(b, func(ctx context.Context, c *Comm, send, recv []float64) error {
		return Allreduce(ctx, c, send, recv, Sum)
	})
}

// BenchmarkIallreduce is BenchmarkAllreduce with an Iallreduce and its
// Wait: what a non-blocking collective's hand-off costs.
func BenchmarkIallreduce(b *testing.B) {
	benchAllreduce(b, func(ctx context.Context, c *Comm, send, recv []float64) error {
		_, err := Iallreduce(ctx, c, send, recv, Sum).Wait(ctx)
		return err
	})
}

func benchAllreduce(b *testing.B, call func(ctx context.Context, c *Comm, send, recv []float64) error) {
	comms := world(b, 2, nil)
	for _, size := range []int{8, 1024, 1 << 20} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			b.SetBytes(int64(size))
			vecs := [2][]float64{make([]float64, size/8), make([]float64, size/8)}
			outs := [2][]float64{make([]float64, size/8), make([]float64, size/8)}
			done := make(chan error, 1)
			ctx := context.Background()
			go func() {
				for range b.N {
					if err := call(ctx, comms[1], vecs[1], outs[1]); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			for range b.N {
				if err := call(ctx, comms[0], vecs[0], outs[0]); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkBarrier passes barriers of 2, 4 and 8 ranks of one node,
// goroutines of this process: with more ranks than CPUs, the waiting ones
// poll with runtime.Gosched (engine.drive).
func BenchmarkBarrier(b *testing.B) {
	for _, n := range []int{2, 4, 8} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			comms := world(b, n, nil)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i, c := range comms {
				wg.Go(func() {
					for range b.N {
						if err := c.Barrier(ctx); err != nil {
							errs[i] = err
							cancel()
							return
						}
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestBytes: Bytes is a view of the vector's memory, not a copy.
func TestBytes(t *testing.T) {
	v := []uint16{0x0102, 0x0304}
	b := Bytes(v)
	if len(b) != 4 {
		t.Fatalf("%d bytes, want 4", len(b))
	}
	b[0], b[3] = 0xff, 0xee
	if v[0]&0xff != 0xff && v[0]>>8 != 0xff || v[1]&0xff != 0xee && v[1]>>8 != 0xee {
		t.Fatalf("writing the bytes did not change the vector: %x", v)
	}
	if Bytes([]float64{}) != nil || Bytes[int8](nil) != nil {
		t.Fatal("an empty vector's bytes are not nil")
	}
}

// TestEmptyBlockDisplacement: an empty block's displacement is not
// looked at, as in MPI, even outside the buffer.
func TestEmptyBlockDisplacement(t *testing.T) {
	comms := world(t, 3, nil)
	counts, displs := []int{0, 2, 1}, []int{1000, 1, 4}
	each(t, comms, func(ctx context.Context, c *Comm) error {
		recv := []byte("-----")
		send := bytes.Repeat([]byte{byte('a' + c.Rank())}, counts[c.Rank()])
		if err := c.Allgatherv(ctx, send, recv, counts, displs); err != nil {
			return err
		}
		if string(recv) != "-bb-c" {
			return fmt.Errorf("allgatherv: %q, want -bb-c", recv)
		}
		return nil
	})
}
