// Package pt2pt measures point-to-point performance between two ranks of a
// communicator the way the OSU Micro-Benchmarks do (osu_latency, osu_bw),
// so that figures from xrc sit next to figures from an MPI library:
//
//   - Latency: a ping-pong. Rank 0 sends a message of the size to rank 1,
//     which sends one back; the one-way latency is half the round trip,
//     averaged over the timed iterations after some untimed warm-up
//     iterations.
//   - Bandwidth: a stream. Rank 0 starts a window of non-blocking sends
//     (64 by default) and waits for them, then waits for a 4-byte reply
//     that says rank 1 has received the whole window; MB/s (10^6 bytes a
//     second) is the bytes of the timed windows over their time.
//
// Sizes double from MinSize to MaxSize (0 counts as the first size; the
// next is 1). As OSU does, sizes above LargeSize run fewer iterations.
//
// The functions use only comm's public API, so they measure whatever
// transport comm takes between the two ranks: shared memory on one node,
// RC or XRC between nodes.
package pt2pt

import (
	"context"
	"fmt"
	"time"

	"github.com/xrcrun/xrc/comm"
)

// Test names a benchmark.
type Test string

const (
	TestLatency   Test = "latency"
	TestBandwidth Test = "bw"
)

// Config says which sizes to measure and how many times.
type Config struct {
	MinSize, MaxSize int
	// Iters and Warmup are the timed and untimed iterations of a size up
	// to LargeSize; ItersLarge and WarmupLarge those of larger sizes. An
	// iteration is one round trip (latency) or one window and its reply
	// (bandwidth).
	Iters, Warmup           int
	ItersLarge, WarmupLarge int
	LargeSize               int
	// Window is the number of sends in flight in the bandwidth test.
	Window int
}

// Defaults returns OSU's defaults for test: latency 10000 iterations
// (100 warm-up) up to 8 KiB and 1000 (10) above; bandwidth 100 windows
// (10 warm-up) up to 8 KiB and 20 (2) above, windows of 64 sends; sizes
// from 0 (latency) or 1 (bandwidth) to 4 MiB.
func Defaults(test Test) Config {
	if test == TestBandwidth {
		return Config{MinSize: 1, MaxSize: 4 << 20, Iters: 100, Warmup: 10, ItersLarge: 20, WarmupLarge: 2,
			LargeSize: 8 << 10, Window: 64}
	}
	return Config{MinSize: 0, MaxSize: 4 << 20, Iters: 10000, Warmup: 100, ItersLarge: 1000, WarmupLarge: 10,
		LargeSize: 8 << 10, Window: 64}
}

// Sizes lists the sizes cfg measures.
func (cfg Config) Sizes() []int {
	var s []int
	for n := cfg.MinSize; n <= cfg.MaxSize; n = max(2*n, 1) {
		s = append(s, n)
	}
	return s
}

func (cfg Config) iters(size int) (iters, warmup int) {
	if size > cfg.LargeSize {
		return cfg.ItersLarge, cfg.WarmupLarge
	}
	return cfg.Iters, cfg.Warmup
}

func (cfg Config) check(test Test) error {
	switch {
	case test != TestLatency && test != TestBandwidth:
		return fmt.Errorf("pt2pt: unknown test %q (latency or bw)", test)
	case cfg.MinSize < 0 || cfg.MaxSize < cfg.MinSize:
		return fmt.Errorf("pt2pt: sizes %d to %d", cfg.MinSize, cfg.MaxSize)
	case cfg.Iters < 1 || cfg.ItersLarge < 1 || cfg.Warmup < 0 || cfg.WarmupLarge < 0:
		return fmt.Errorf("pt2pt: %d/%d iterations, %d/%d warm-up", cfg.Iters, cfg.ItersLarge, cfg.Warmup, cfg.WarmupLarge)
	case test == TestBandwidth && cfg.Window < 1:
		return fmt.Errorf("pt2pt: window of %d", cfg.Window)
	}
	return nil
}

// Result is the measurement of one size, as rank 0 timed it.
type Result struct {
	Size    int           `json:"size"`
	Iters   int           `json:"iterations"`
	Warmup  int           `json:"warmup"`
	Window  int           `json:"window,omitempty"`
	Elapsed time.Duration `json:"elapsed_ns"`
	// LatencyUS is the one-way latency in microseconds (latency test).
	LatencyUS float64 `json:"latency_us,omitempty"`
	// MBps is the bandwidth in 10^6 bytes a second (bandwidth test).
	MBps float64 `json:"bandwidth_mbps,omitempty"`
}

// Pair describes the two ranks measured.
type Pair struct {
	SameNode bool // the ranks share a node (comm's SplitByNode says so)
}

// Tags of the benchmarks' messages.
const (
	tagSync = 1
	tagPing = 2
	tagData = 3
	tagAck  = 4
)

// Run measures test between ranks 0 and 1 of c, which must have exactly
// two ranks; both call it with the same cfg. Rank 0 returns a Result per
// size and the pair's placement; rank 1 returns nil results.
func Run(ctx context.Context, c *comm.Comm, test Test, cfg Config) ([]Result, Pair, error) {
	var pair Pair
	if err := cfg.check(test); err != nil {
		return nil, pair, err
	}
	if c.Size() != 2 {
		return nil, pair, fmt.Errorf("pt2pt: the test takes exactly 2 ranks, not %d", c.Size())
	}
	b := &bench{c: c, peer: 1 - c.Rank(), cfg: cfg}
	local, err := c.SplitByNode(ctx)
	if err != nil {
		return nil, pair, err
	}
	pair.SameNode = local.Size() == 2

	b.sbuf = make([]byte, max(cfg.MaxSize, 4))
	b.rbuf = make([]byte, max(cfg.MaxSize, 4))
	for i := range b.sbuf {
		b.sbuf[i] = 'a'
		b.rbuf[i] = 'b'
	}
	if test == TestBandwidth {
		b.reqs = make([]*comm.Request, cfg.Window)
	}
	var out []Result
	for _, size := range cfg.Sizes() {
		if err := b.sync(ctx); err != nil {
			return nil, pair, err
		}
		var r Result
		var err error
		if test == TestLatency {
			r, err = b.latency(ctx, size)
		} else {
			r, err = b.bandwidth(ctx, size)
		}
		if err != nil {
			return nil, pair, fmt.Errorf("pt2pt: %s, %d bytes: %w", test, size, err)
		}
		if c.Rank() == 0 {
			out = append(out, r)
		}
	}
	return out, pair, b.sync(ctx)
}

type bench struct {
	c          *comm.Comm
	peer       int
	cfg        Config
	sbuf, rbuf []byte
	reqs       []*comm.Request
}

// sync returns once both ranks have called it: an empty exchange, which
// for two ranks is a barrier.
func (b *bench) sync(ctx context.Context) error {
	_, err := b.c.Sendrecv(ctx, nil, b.peer, tagSync, nil, b.peer, tagSync)
	return err
}

func (b *bench) latency(ctx context.Context, size int) (Result, error) {
	iters, warmup := b.cfg.iters(size)
	c, s, r := b.c, b.sbuf[:size], b.rbuf[:size]
	var start time.Time
	for i := range iters + warmup {
		if i == warmup {
			start = time.Now()
		}
		if c.Rank() == 0 {
			if err := c.Send(ctx, s, b.peer, tagPing); err != nil {
				return Result{}, err
			}
			if err := recvAll(ctx, c, r, b.peer, tagPing); err != nil {
				return Result{}, err
			}
		} else {
			if err := recvAll(ctx, c, r, b.peer, tagPing); err != nil {
				return Result{}, err
			}
			if err := c.Send(ctx, s, b.peer, tagPing); err != nil {
				return Result{}, err
			}
		}
	}
	d := time.Since(start)
	return Result{Size: size, Iters: iters, Warmup: warmup, Elapsed: d,
		LatencyUS: d.Seconds() * 1e6 / float64(2*iters)}, nil
}

func (b *bench) bandwidth(ctx context.Context, size int) (Result, error) {
	iters, warmup := b.cfg.iters(size)
	c, s, r := b.c, b.sbuf[:size], b.rbuf[:size]
	ack := b.rbuf[:4]
	var start time.Time
	for i := range iters + warmup {
		if i == warmup {
			start = time.Now()
		}
		var err error
		if c.Rank() == 0 {
			for w := range b.reqs {
				if b.reqs[w], err = c.Isend(s, b.peer, tagData); err != nil {
					return Result{}, err
				}
			}
			if _, err := comm.Waitall(ctx, b.reqs...); err != nil {
				return Result{}, err
			}
			if err := recvAll(ctx, c, ack, b.peer, tagAck); err != nil {
				return Result{}, err
			}
		} else {
			for w := range b.reqs {
				if b.reqs[w], err = c.Irecv(r, b.peer, tagData); err != nil {
					return Result{}, err
				}
			}
			sts, err := comm.Waitall(ctx, b.reqs...)
			if err != nil {
				return Result{}, err
			}
			for _, st := range sts {
				if st.Count != size {
					return Result{}, fmt.Errorf("received %d bytes", st.Count)
				}
			}
			if err := c.Send(ctx, b.sbuf[:4], b.peer, tagAck); err != nil {
				return Result{}, err
			}
		}
	}
	d := time.Since(start)
	return Result{Size: size, Iters: iters, Warmup: warmup, Window: b.cfg.Window, Elapsed: d,
		MBps: float64(size) * float64(iters) * float64(b.cfg.Window) / d.Seconds() / 1e6}, nil
}

// recvAll receives exactly len(buf) bytes.
func recvAll(ctx context.Context, c *comm.Comm, buf []byte, src, tag int) error {
	st, err := c.Recv(ctx, buf, src, tag)
	if err == nil && st.Count != len(buf) {
		err = fmt.Errorf("received %d bytes, want %d", st.Count, len(buf))
	}
	return err
}
