// Command osu measures comm's point-to-point latency and bandwidth between
// two ranks as the OSU Micro-Benchmarks' osu_latency and osu_bw do, and
// prints their tables:
//
//	xrcrun -n 2 ./bench/osu -test latency        # one node: shared memory
//	xrcrun -n 2 ./bench/osu -test bw
//	xrcrun -n 2 --nodes 2 --transport rc ./bench/osu -test latency   # between emulated nodes
//
// -json prints the results as JSON instead, -gobench in Go's benchmark
// format as well. docs/benchmarks.md has the method and figures.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/xrcrun/xrc/bench/pt2pt"
	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/comm"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) { // -h printed the usage asked for
		fmt.Fprintln(os.Stderr, "osu:", err)
		os.Exit(1)
	}
}

// options are what the command line asks for.
type options struct {
	test                   pt2pt.Test
	cfg                    pt2pt.Config
	json, goBench          bool
	cpuProfile, memProfile string
}

// parse reads the command line; -h prints the usage on stderr.
func parse(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("osu", flag.ContinueOnError)
	fs.SetOutput(stderr)
	test := fs.String("test", "latency", "the test: latency (ping-pong, as osu_latency) or bw (streaming, as osu_bw)")
	sizes := fs.String("m", "", "message sizes `[MIN:]MAX` in bytes, or MIN: (default 0:4194304 for latency, 1:4194304 for bw)")
	iters, itersLarge := count{min: 1}, count{min: 1}
	var warmup, warmupLarge count
	fs.Var(&iters, "i", "`N` timed iterations, of every size as OSU's -i unless -il (default 10000 for latency, 100 for bw)")
	fs.Var(&warmup, "x", "`N` warm-up iterations, of every size as OSU's -x unless -xl (default 100 for latency, 10 for bw)")
	fs.Var(&itersLarge, "il", "`N` timed iterations above 8 KiB, over -i (default 1000 for latency, 20 for bw)")
	fs.Var(&warmupLarge, "xl", "`N` warm-up iterations above 8 KiB, over -x (default 10 for latency, 2 for bw)")
	window := fs.Int("W", 64, "sends in flight in the bandwidth test")
	asJSON := fs.Bool("json", false, "print the results as JSON instead of the table")
	goBench := fs.Bool("gobench", false, "print Go benchmark format lines after the table")
	cpuProfile := fs.String("cpuprofile", "", "write each rank's CPU profile to `FILE`.RANK")
	memProfile := fs.String("memprofile", "", "write each rank's allocation profile to `FILE`.RANK (every allocation sampled)")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	t := pt2pt.Test(*test)
	cfg := pt2pt.Defaults(t)
	if *sizes != "" {
		lo, hi, err := parseSizes(*sizes, cfg.MinSize, cfg.MaxSize)
		if err != nil {
			return options{}, err
		}
		cfg.MinSize, cfg.MaxSize = lo, hi
	}
	// As OSU's, -i and -x count for the large sizes too; -il and -xl,
	// which OSU does not have, override them there.
	iters.setIn(&cfg.Iters, &cfg.ItersLarge)
	warmup.setIn(&cfg.Warmup, &cfg.WarmupLarge)
	itersLarge.setIn(&cfg.ItersLarge)
	warmupLarge.setIn(&cfg.WarmupLarge)
	cfg.Window = *window
	return options{test: t, cfg: cfg, json: *asJSON, goBench: *goBench, cpuProfile: *cpuProfile, memProfile: *memProfile}, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	t := o.test
	w, err := comm.Init(ctx, comm.Config{})
	if err != nil {
		return err
	}
	if w.Size() != 2 {
		// Every rank knows: no one waits for another.
		return errors.Join(fmt.Errorf("the test takes exactly 2 ranks, not %d (xrcrun -n 2)", w.Size()), w.Finalize(ctx))
	}
	stop, err := profile(o.cpuProfile, o.memProfile, w.Rank())
	if err != nil {
		return errors.Join(err, w.Finalize(ctx))
	}
	res, pair, err := pt2pt.Run(ctx, w, t, o.cfg)
	err = errors.Join(err, stop())
	if err != nil {
		// The other rank waits for messages that will not come: end
		// the job rather than hang it.
		fmt.Fprintf(stderr, "osu: rank %d: %v\n", w.Rank(), err)
		w.Abort(ctx, 1, err.Error())
	}
	if w.Rank() == 0 {
		rep := pt2pt.Report{Test: t, SameNode: pair.SameNode, Results: res, Transport: os.Getenv(bootstrap.EnvTransport)}
		rep.Where = "2 ranks on one node (shared memory)"
		if !pair.SameNode {
			rep.Where = "2 ranks on two nodes"
		}
		if o.json {
			err = pt2pt.WriteJSON(stdout, rep)
		} else {
			err = pt2pt.WriteTable(stdout, rep)
			if err == nil && o.goBench {
				err = pt2pt.WriteGoBench(stdout, rep)
			}
		}
	}
	return errors.Join(err, w.Finalize(ctx))
}

// profile starts the profiles asked for, into files named for the rank,
// and returns the function that writes them.
func profile(cpu, mem string, rank int) (stop func() error, err error) {
	var f *os.File
	if cpu != "" {
		if f, err = os.Create(fmt.Sprintf("%s.%d", cpu, rank)); err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, err
		}
	}
	if mem != "" {
		runtime.MemProfileRate = 1
	}
	return func() error {
		var err error
		if f != nil {
			pprof.StopCPUProfile()
			err = f.Close()
		}
		if mem != "" {
			m, cerr := os.Create(fmt.Sprintf("%s.%d", mem, rank))
			if cerr != nil {
				return errors.Join(err, cerr)
			}
			err = errors.Join(err, pprof.Lookup("allocs").WriteTo(m, 0), m.Close())
		}
		return err
	}, nil
}

// parseSizes reads OSU's -m argument: MAX, MIN:MAX, or MIN: (the
// default MAX).
func parseSizes(s string, defMin, defMax int) (lo, hi int, err error) {
	lo = defMin
	a, b, ok := strings.Cut(s, ":")
	if ok {
		if lo, err = strconv.Atoi(a); err != nil {
			return 0, 0, fmt.Errorf("-m %q: %w", s, err)
		}
	} else {
		b = a
	}
	if ok && b == "" {
		b = strconv.Itoa(defMax)
	}
	if hi, err = strconv.Atoi(b); err != nil {
		return 0, 0, fmt.Errorf("-m %q: %w", s, err)
	}
	if lo < 0 || hi < lo {
		return 0, 0, fmt.Errorf("-m %q: sizes %d to %d", s, lo, hi)
	}
	return lo, hi, nil
}

// count is a flag for a count of min or more (warm-up iterations may be
// 0, timed ones not, as OSU says), whose default depends on the test.
// Unset, it prints as "" so that -h gives only the default its usage
// names (an int flag with -1 for unset added "(default -1)").
type count struct {
	n, min int
	set    bool
}

func (c *count) String() string {
	if c == nil || !c.set {
		return ""
	}
	return strconv.Itoa(c.n)
}

func (c *count) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < c.min {
		return fmt.Errorf("not a count (an integer, %d or more)", c.min)
	}
	c.n, c.set = n, true
	return nil
}

// setIn stores the count in each dst if the flag was given.
func (c *count) setIn(dst ...*int) {
	if c.set {
		for _, d := range dst {
			*d = c.n
		}
	}
}
