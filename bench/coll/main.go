// Command coll measures comm's collectives on the model of the OSU
// Micro-Benchmarks' osu_allreduce, osu_bcast and osu_barrier, and prints
// their table (it times calls back to back, where OSU puts a barrier after
// each; docs/benchmarks.md, "Collectives"):
//
//	xrcrun -n 4 ./bench/coll -test allreduce   # sums of float64s, 8 B to 1 MiB
//	xrcrun -n 4 ./bench/coll -test bcast       # from rank 0, 1 B to 1 MiB
//	xrcrun -n 4 ./bench/coll -test barrier
//	xrcrun -n 4 ./bench/coll -test iallreduce  # overlap, after osu_iallreduce
//
// For each size every rank makes warm-up calls, passes a barrier, and
// times the calls that follow; the table gives the average over the ranks
// of their time per call, and the least and the most of a rank, in µs.
//
// iallreduce times comm.Iallreduce and its Wait (pure), then the same
// with the rank computing (spinning) for the longest rank's pure time
// between the two: the table gives the averages over the ranks of the
// overall time, the time computed and the pure time, and the share of
// the communication hidden behind the computation, as OSU's overlap:
// 100 − 100·(overall − compute)/pure, within 0 to 100.
//
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
	os.Exit(status(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr), os.Stderr))
}

// status is the exit status of a run that returned err, which it reports
// on stderr: 0 for -h, whose usage the flag package printed, as asked.
func status(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(stderr, "coll:", err)
	return 1
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
	fs.StringVar(&cfg.test, "test", "allreduce", "the test: allreduce, bcast, barrier or iallreduce")
	fs.IntVar(&cfg.max, "max", 1<<20, "the largest size in bytes")
	fs.IntVar(&cfg.iters, "i", 1000, "timed calls, of every size as OSU's -i unless -il")
	fs.IntVar(&cfg.warmup, "x", 200, "warm-up calls, of every size as OSU's -x unless -xl")
	fs.IntVar(&cfg.itersLarge, "il", 100, "timed calls above 8 KiB, over -i")
	fs.IntVar(&cfg.warmLrg, "xl", 10, "warm-up calls above 8 KiB, over -x")
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if given["i"] && !given["il"] {
		cfg.itersLarge = cfg.iters
	}
	if given["x"] && !given["xl"] {
		cfg.warmLrg = cfg.warmup
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch cfg.test {
	case "allreduce", "iallreduce":
		cfg.min = 8
	case "bcast":
		cfg.min = 1
	case "barrier":
		cfg.min, cfg.max = 0, 0
	default:
		return fmt.Errorf("-test %q: allreduce, bcast, barrier or iallreduce", cfg.test)
	}
	if cfg.max < cfg.min || cfg.iters <= 0 || cfg.itersLarge <= 0 || cfg.warmup < 0 || cfg.warmLrg < 0 {
		return errors.New("sizes or iterations out of range")
	}
	w, err := comm.Init(ctx, comm.Config{})
	if err != nil {
		return err
	}
	if w.Rank() == 0 {
		fmt.Fprintf(stdout, "# xrc %s, %d ranks\n", cfg.test, w.Size())
		if cfg.test == "iallreduce" {
			fmt.Fprintf(stdout, "# %-10s %12s %12s %14s %10s\n", "Size", "Overall(us)", "Compute(us)", "Pure Comm.(us)", "Overlap(%)")
		} else {
			fmt.Fprintf(stdout, "# %-10s %12s %12s %12s %10s\n", "Size", "Avg(us)", "Min(us)", "Max(us)", "Iterations")
		}
	}
	for size := cfg.min; ; size *= 2 {
		iters, warm := cfg.iters, cfg.warmup
		if size > large {
			iters, warm = cfg.itersLarge, cfg.warmLrg
		}
		var row string
		var err error
		if cfg.test == "iallreduce" {
			row, err = overlap(ctx, w, size, iters, warm)
		} else {
			var avg, lo, hi float64
			avg, lo, hi, err = measure(ctx, w, cfg.test, size, iters, warm)
			label := fmt.Sprint(size)
			if cfg.test == "barrier" {
				label = "-"
			}
			row = fmt.Sprintf("  %-10s %12.2f %12.2f %12.2f %10d\n", label, avg, lo, hi, iters)
		}
		if err != nil {
			// The others wait for this rank: end the job rather than
			// hang it.
			fmt.Fprintf(stderr, "coll: rank %d: %v\n", w.Rank(), err)
			w.Abort(ctx, 1, err.Error())
		}
		if w.Rank() == 0 {
			fmt.Fprint(stdout, row)
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

// overlap measures Iallreduce of size bytes after osu_iallreduce (every
// rank computes for the longest rank's pure time, where OSU's computes for
// its own; no barrier between calls and no Test while computing, in
// coll.c too) and returns the table's row (at rank 0; the others get the
// same).
func overlap(ctx context.Context, w *comm.Comm, size, iters, warm int) (string, error) {
	vec := make([]float64, size/8)
	out := make([]float64, size/8)
	for i := range vec {
		vec[i] = float64(w.Rank() + i)
	}
	// timed runs iters calls, computing for spin between the start and
	// the wait, and returns the time per call and the time computed per
	// call, in µs.
	timed := func(iters int, spin time.Duration) (total, computed float64, err error) {
		if err := w.Barrier(ctx); err != nil {
			return 0, 0, err
		}
		var busy time.Duration
		start := time.Now()
		for range iters {
			r := comm.Iallreduce(ctx, w, vec, out, comm.Sum)
			if spin > 0 {
				s := time.Now()
				for time.Since(s) < spin {
				}
				busy += time.Since(s)
			}
			if _, err := r.Wait(ctx); err != nil {
				return 0, 0, err
			}
		}
		per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(iters) }
		return per(time.Since(start)), per(busy), nil
	}
	if _, _, err := timed(warm, 0); err != nil {
		return "", err
	}
	pure, _, err := timed(iters, 0)
	if err != nil {
		return "", err
	}
	// Every rank computes for the longest pure time.
	longest := []float64{0}
	if err := comm.Allreduce(ctx, w, []float64{pure}, longest, comm.Max); err != nil {
		return "", err
	}
	overall, computed, err := timed(iters, time.Duration(longest[0]*1e3))
	if err != nil {
		return "", err
	}
	if len(out) > 0 {
		n := float64(w.Size())
		if want := n*float64(len(out)-1) + n*(n-1)/2; out[len(out)-1] != want {
			return "", fmt.Errorf("iallreduce of %d bytes: %v, want %v", size, out[len(out)-1], want)
		}
	}
	mine := []float64{overall, computed, pure}
	sums := make([]float64, 3)
	if err := comm.Allreduce(ctx, w, mine, sums, comm.Sum); err != nil {
		return "", err
	}
	n := float64(w.Size())
	overall, computed, pure = sums[0]/n, sums[1]/n, sums[2]/n
	hidden := min(max(100-100*(overall-computed)/pure, 0), 100)
	return fmt.Sprintf("  %-10d %12.2f %12.2f %14.2f %10.2f\n", size, overall, computed, pure, hidden), nil
}
