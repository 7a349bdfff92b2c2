// Command coll measures comm's collectives as the OSU Micro-Benchmarks'
// osu_allreduce, osu_bcast and osu_barrier measure an MPI library's, and
// prints their table:
//
//	xrcrun -n 4 ./bench/coll -test allreduce   # sums of float64s, 8 B to 1 MiB
//	xrcrun -n 4 ./bench/coll -test bcast       # from rank 0, 1 B to 1 MiB
//	xrcrun -n 4 ./bench/coll -test barrier
//
// For each size every rank makes warm-up calls, passes a barrier, and
// times the calls that follow; the table gives the average over the ranks
// of their time per call, and the least and the most of a rank, in µs.
// bench/ompi/coll.c measures an MPI library the same way.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/xrcrun/xrc/comm"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "coll:", err)
		os.Exit(1)
	}
}

// Iterations, as OSU's defaults: sizes above large get fewer.
const large = 8192

type config struct {
	test                string
	min, max            int
	iters, warmup       int
	itersLarge, warmLrg int
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("coll", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	fs.StringVar(&cfg.test, "test", "allreduce", "the test: allreduce, bcast or barrier")
	fs.IntVar(&cfg.max, "max", 1<<20, "the largest size in bytes")
	fs.IntVar(&cfg.iters, "i", 1000, "timed calls up to 8 KiB")
	fs.IntVar(&cfg.warmup, "x", 200, "warm-up calls up to 8 KiB")
	fs.IntVar(&cfg.itersLarge, "il", 100, "timed calls above 8 KiB")
	fs.IntVar(&cfg.warmLrg, "xl", 10, "warm-up calls above 8 KiB")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch cfg.test {
	case "allreduce":
		cfg.min = 8
	case "bcast":
		cfg.min = 1
	case "barrier":
		cfg.min, cfg.max = 0, 0
	default:
		return fmt.Errorf("-test %q: allreduce, bcast or barrier", cfg.test)
	}
	if cfg.max < cfg.min || cfg.iters <= 0 || cfg.itersLarge <= 0 || cfg.warmup < 0 || cfg.warmLrg < 0 {
		return errors.New("sizes or iterations out of range")
	}
	w, err := comm.Init(ctx, comm.Config{})
	if err != nil {
		return err
	}
	if w.Rank() == 0 {
		fmt.Fprintf(stdout, "# xrc %s, %d ranks\n# %-10s %12s %12s %12s %10s\n", cfg.test, w.Size(), "Size", "Avg(us)", "Min(us)", "Max(us)", "Iterations")
	}
	for size := cfg.min; ; size *= 2 {
		iters, warm := cfg.iters, cfg.warmup
		if size > large {
			iters, warm = cfg.itersLarge, cfg.warmLrg
		}
		avg, lo, hi, err := measure(ctx, w, cfg.test, size, iters, warm)
		if err != nil {
			// The others wait for this rank: end the job rather than
			// hang it.
			fmt.Fprintf(stderr, "coll: rank %d: %v\n", w.Rank(), err)
			w.Abort(ctx, 1, err.Error())
		}
		if w.Rank() == 0 {
			label := fmt.Sprint(size)
			if cfg.test == "barrier" {
				label = "-"
			}
			fmt.Fprintf(stdout, "  %-10s %12.2f %12.2f %12.2f %10d\n", label, avg, lo, hi, iters)
		}
		if size == 0 || size*2 > cfg.max {
			break
		}
	}
	return w.Finalize(ctx)
}

// measure times iters calls of the test at size after warm ones and
// returns the ranks' average, least and most time per call in µs (at rank
// 0; the others get zeros).
func measure(ctx context.Context, w *comm.Comm, test string, size, iters, warm int) (avg, lo, hi float64, err error) {
	buf := make([]byte, size)
	vec := make([]float64, size/8)
	out := make([]float64, size/8)
	for i := range vec {
		vec[i] = float64(w.Rank() + i)
	}
	call := func() error {
		switch test {
		case "allreduce":
			return comm.Allreduce(ctx, w, vec, out, comm.Sum)
		case "bcast":
			return w.Bcast(ctx, buf, 0)
		default:
			return w.Barrier(ctx)
		}
	}
	for range warm {
		if err := call(); err != nil {
			return 0, 0, 0, err
		}
	}
	if err := w.Barrier(ctx); err != nil {
		return 0, 0, 0, err
	}
	start := time.Now()
	for range iters {
		if err := call(); err != nil {
			return 0, 0, 0, err
		}
	}
	t := []float64{float64(time.Since(start).Nanoseconds()) / 1e3 / float64(iters)}
	if test == "allreduce" && len(out) > 0 {
		// Every rank's vector holds rank+i: the sums are known.
		n := float64(w.Size())
		if want := n*float64(len(out)-1) + n*(n-1)/2; out[len(out)-1] != want {
			return 0, 0, 0, fmt.Errorf("allreduce of %d bytes: %v, want %v", size, out[len(out)-1], want)
		}
	}
	sum, least, most := make([]float64, 1), make([]float64, 1), make([]float64, 1)
	err = errors.Join(comm.Reduce(ctx, w, t, sum, comm.Sum, 0),
		comm.Reduce(ctx, w, t, least, comm.Min, 0),
		comm.Reduce(ctx, w, t, most, comm.Max, 0))
	return sum[0] / float64(w.Size()), least[0], most[0], err
}
