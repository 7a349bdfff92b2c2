package pt2pt

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/comm"
)

// pair makes a world of two ranks of one node in this process.
func pair(t *testing.T) [2]*comm.Comm {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	key := make([]byte, 32)
	rand.Read(key)
	srv, err := bootstrap.Listen(ctx, "127.0.0.1:0", bootstrap.ServerConfig{Size: 2, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ctx)
	t.Cleanup(func() { srv.Close() })
	dir := t.TempDir()
	var comms [2]*comm.Comm
	var errs [2]error
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			env := bootstrap.Env{Rank: r, Size: 2, LocalRank: r, LocalSize: 2, Nodes: 1, Addr: srv.Addr(), Key: key, JobID: "pt2pt"}
			c, err := bootstrap.Join(ctx, env.Addr, key, bootstrap.Member{Rank: r, LocalRank: r}, 2, bootstrap.ClientConfig{})
			if err != nil {
				errs[r] = err
				return
			}
			comms[r], errs[r] = comm.Init(ctx, comm.Config{Bootstrap: c, Env: &env, Dir: dir})
		})
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, c := range comms {
			wg.Go(func() { c.Finalize(ctx) })
		}
		wg.Wait()
	})
	return comms
}

// run runs test on both ranks and returns rank 0's report.
func run(t *testing.T, comms [2]*comm.Comm, test Test, cfg Config) Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var res [2][]Result
	var pairs [2]Pair
	var errs [2]error
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() { res[r], pairs[r], errs[r] = Run(ctx, comms[r], test, cfg) })
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		t.Fatal(err)
	}
	if res[1] != nil {
		t.Errorf("rank 1 returned %d results", len(res[1]))
	}
	if !pairs[0].SameNode || !pairs[1].SameNode {
		t.Errorf("pairs %+v: want the same node", pairs)
	}
	return Report{Test: test, SameNode: pairs[0].SameNode, Where: "test", Results: res[0]}
}

// small is a quick configuration with both small and large sizes.
func small(test Test) Config {
	cfg := Defaults(test)
	cfg.MaxSize = 64 << 10
	cfg.Iters, cfg.Warmup, cfg.ItersLarge, cfg.WarmupLarge = 20, 2, 4, 1
	cfg.Window = 8
	return cfg
}

func TestRun(t *testing.T) {
	comms := pair(t)
	for _, test := range []Test{TestLatency, TestBandwidth} {
		t.Run(string(test), func(t *testing.T) {
			cfg := small(test)
			rep := run(t, comms, test, cfg)
			var sizes []int
			for _, r := range rep.Results {
				sizes = append(sizes, r.Size)
				iters, warmup := 20, 2
				if r.Size > cfg.LargeSize {
					iters, warmup = 4, 1
				}
				if r.Iters != iters || r.Warmup != warmup || r.Elapsed <= 0 {
					t.Errorf("size %d: %+v", r.Size, r)
				}
				if v := r.LatencyUS + r.MBps; !(v > 0) || (r.LatencyUS > 0) != (test == TestLatency) {
					t.Errorf("size %d: latency %v, bandwidth %v", r.Size, r.LatencyUS, r.MBps)
				}
			}
			if want := cfg.Sizes(); !slices.Equal(sizes, want) {
				t.Fatalf("sizes %v, want %v", sizes, want)
			}
			checkTable(t, rep)

			var buf bytes.Buffer
			if err := WriteJSON(&buf, rep); err != nil {
				t.Fatal(err)
			}
			var back Report
			if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
				t.Fatal(err)
			}
			if back.Test != test || len(back.Results) != len(rep.Results) || back.Results[1] != rep.Results[1] {
				t.Errorf("JSON round trip: %+v", back)
			}

			buf.Reset()
			if err := WriteGoBench(&buf, rep); err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
				if f := strings.Split(l, "\t"); len(f) < 3 || !strings.HasPrefix(f[0], "BenchmarkOSU") || !strings.HasSuffix(f[2], " ns/op") {
					t.Errorf("benchmark line %q", l)
				}
			}
		})
	}
}

// checkTable checks that WriteTable prints OSU's shape: comment lines,
// the column header, then a size and a positive number per line, every
// size of the report in order.
func checkTable(t *testing.T, rep Report) {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteTable(&buf, rep); err != nil {
		t.Fatal(err)
	}
	sizes, err := ParseTable(buf.String())
	if err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	if len(sizes) != len(rep.Results) {
		t.Fatalf("%d rows for %d results\n%s", len(sizes), len(rep.Results), buf.String())
	}
	for i, r := range rep.Results {
		if sizes[i].Size != r.Size {
			t.Errorf("row %d: size %d, want %d", i, sizes[i].Size, r.Size)
		}
	}
}

func TestParseTable(t *testing.T) {
	for _, c := range []struct {
		in   string
		rows int
		bad  bool
	}{
		{"# T\n# Size          Latency (us)\n0                       0.21\n1     0.50\n", 2, false},
		{"# T\n# Size      Bandwidth (MB/s)\n1 3.2\n", 1, false},
		{"# T\n0 0.21\n", 0, true},                                // no column header
		{"# Size          Latency (us)\n8 x\n", 0, true},          // not a number
		{"# Size          Latency (us)\n8 1.0\n4 1.0\n", 0, true}, // sizes out of order
		{"# Size          Latency (us)\n8 -1\n", 0, true},
	} {
		rows, err := ParseTable(c.in)
		if (err != nil) != c.bad || len(rows) != c.rows {
			t.Errorf("%q: %d rows, err %v", c.in, len(rows), err)
		}
	}
}

func TestParseSizesConfig(t *testing.T) {
	if got := Defaults(TestLatency).Sizes(); len(got) != 24 || got[0] != 0 || got[1] != 1 || got[23] != 4<<20 {
		t.Errorf("latency sizes %v", got)
	}
	if got := Defaults(TestBandwidth).Sizes(); len(got) != 23 || got[0] != 1 || got[22] != 4<<20 {
		t.Errorf("bandwidth sizes %v", got)
	}
	for _, cfg := range []Config{{MinSize: 4, MaxSize: 2}, {MaxSize: 8, Iters: 0, ItersLarge: 1}} {
		if err := cfg.check(TestLatency); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
	if err := Defaults(TestLatency).check("pingpong"); err == nil || !strings.Contains(err.Error(), strconv.Quote("pingpong")) {
		t.Errorf("unknown test: %v", err)
	}
}
