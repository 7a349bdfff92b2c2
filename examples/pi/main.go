// Command pi computes π by the midpoint rule, as MPI's classic cpi
// example does: rank 0 broadcasts the number of intervals, every rank sums
// its share of them, and Allreduce adds the shares, so that every rank
// holds the same π; Allgather checks that they do, to the bit, and Reduce
// finds the slowest rank's time.
//
//	xrcrun -n 4 ./examples/pi -n 100000000
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/xrcrun/xrc/comm"
)

func main() {
	n := flag.Int64("n", 10_000_000, "intervals (rank 0's value counts)")
	flag.Parse()
	if err := run(context.Background(), *n); err != nil {
		fmt.Fprintln(os.Stderr, "pi:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, n int64) error {
	w, err := comm.Init(ctx, comm.Config{})
	if err != nil {
		return err
	}
	rank, size := w.Rank(), w.Size()
	if err := w.Barrier(ctx); err != nil {
		return err
	}
	start := time.Now()
	nv := []int64{n}
	if err := w.Bcast(ctx, comm.Bytes(nv), 0); err != nil {
		return err
	}
	n = nv[0]
	if n <= 0 {
		return fmt.Errorf("%d intervals", n)
	}
	h := 1 / float64(n)
	sum := 0.0
	for i := int64(rank); i < n; i += int64(size) {
		x := h * (float64(i) + 0.5)
		sum += 4 / (1 + x*x)
	}
	pi := []float64{h * sum}
	if err := comm.Allreduce(ctx, w, nil, pi, comm.Sum); err != nil {
		return err
	}
	elapsed := []float64{time.Since(start).Seconds()}
	slowest := make([]float64, 1)
	if err := comm.Reduce(ctx, w, elapsed, slowest, comm.Max, 0); err != nil {
		return err
	}
	all := make([]float64, size)
	if err := w.Allgather(ctx, comm.Bytes(pi), comm.Bytes(all)); err != nil {
		return err
	}
	for r, got := range all {
		if got != pi[0] {
			return fmt.Errorf("rank %d holds π = %.17g, rank %d %.17g", r, got, rank, pi[0])
		}
	}
	if rank == 0 {
		fmt.Printf("pi is approximately %.16f, error %.2g: %d intervals over %d ranks in %.3f s, every rank holds the same bits\n",
			pi[0], math.Abs(pi[0]-math.Pi), n, size, slowest[0])
	}
	return w.Finalize(ctx)
}
