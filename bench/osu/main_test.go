package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

func TestParseSizes(t *testing.T) {
	for _, c := range []struct {
		in     string
		lo, hi int
		bad    bool
	}{
		{"4096", 1, 4096, false},
		{"8:1024", 8, 1024, false},
		{"0:0", 0, 0, false},
		{"x", 0, 0, true},
		{"8:4", 0, 0, true},
		{"-1:4", 0, 0, true},
	} {
		lo, hi, err := parseSizes(c.in, 1, 4<<20)
		if (err != nil) != c.bad || !c.bad && (lo != c.lo || hi != c.hi) {
			t.Errorf("%q: %d, %d, %v", c.in, lo, hi, err)
		}
	}
}

// Without a launcher the program is a world of one, which it refuses.
func TestRunAlone(t *testing.T) {
	t.Setenv("XRC_BOOTSTRAP", "")
	t.Setenv("XRC_RUNTIME_DIR", t.TempDir())
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"-test", "bw"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "exactly 2 ranks") {
		t.Fatalf("err %v", err)
	}
	if err := run(context.Background(), []string{"-m", "8:4"}, &out, &errb); err == nil {
		t.Fatal("-m 8:4: no error")
	}
}

// -h gave -x and -xl their defaults twice, the second a wrong one: "(default
// 100 for latency, 10 for bw) (default -1)", -1 being the mark of unset.
func TestHelpDefaults(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"-h"}, &out, &errb); err == nil {
		t.Fatal("-h: no error")
	}
	help := errb.String()
	for _, line := range strings.Split(help, "\n") {
		if strings.Count(line, "(default") > 1 || strings.Contains(line, "-1") {
			t.Errorf("help line %q", line)
		}
	}
	for _, want := range []string{"(default 100 for latency, 10 for bw)", "(default 10 for latency, 2 for bw)"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q:\n%s", want, help)
		}
	}
}

// -x 0 and -xl 0 (no warm-up) are taken; a negative count is refused,
// where -1 meant the default.
func TestWarmupFlags(t *testing.T) {
	t.Setenv("XRC_BOOTSTRAP", "")
	t.Setenv("XRC_RUNTIME_DIR", t.TempDir())
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"-x", "0", "-xl", "0"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "exactly 2 ranks") {
		t.Errorf("-x 0 -xl 0: %v", err)
	}
	for _, f := range []string{"-x", "-xl"} {
		if err := run(context.Background(), []string{f, "-1"}, &out, &errb); err == nil || strings.Contains(err.Error(), "exactly 2 ranks") {
			t.Errorf("%s -1: %v", f, err)
		}
	}
}

// OSU refuses -i 0 ("Invalid Number of Iterations", osu_util.c's
// set_num_iterations takes 1 or more); -i 0 and -il 0 took the default,
// 0 being the mark of unset, and measured 10000 iterations.
func TestItersFlags(t *testing.T) {
	t.Setenv("XRC_BOOTSTRAP", "")
	t.Setenv("XRC_RUNTIME_DIR", t.TempDir())
	var out, errb bytes.Buffer
	for _, f := range []string{"-i", "-il"} {
		for _, v := range []string{"0", "-1"} {
			if err := run(context.Background(), []string{f, v}, &out, &errb); err == nil || strings.Contains(err.Error(), "exactly 2 ranks") {
				t.Errorf("%s %s: %v", f, v, err)
			}
		}
		if err := run(context.Background(), []string{f, "1"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "exactly 2 ranks") {
			t.Errorf("%s 1: %v", f, err)
		}
	}
}

// OSU's -i and -x set the iterations and warm-up of every size, large
// ones too (osu_util.c's set_num_iterations and set_num_warmup set
// iterations_large and skip_large as well): osu_latency -i 100 runs 100
// iterations at 4 MiB, where bench/osu ran its default 1000. -il and -xl,
// which OSU does not have, still set the large sizes' apart.
func TestItersAllSizes(t *testing.T) {
	for _, c := range []struct {
		args                  []string
		iters, warm, iLg, xLg int
	}{
		{[]string{"-test", "latency"}, 10000, 100, 1000, 10},
		{[]string{"-test", "bw"}, 100, 10, 20, 2},
		{[]string{"-i", "7", "-x", "3"}, 7, 3, 7, 3},
		{[]string{"-test", "bw", "-i", "7", "-x", "0"}, 7, 0, 7, 0},
		{[]string{"-i", "7", "-x", "3", "-il", "5", "-xl", "1"}, 7, 3, 5, 1},
		{[]string{"-il", "5", "-xl", "1", "-i", "7", "-x", "3"}, 7, 3, 5, 1},
		{[]string{"-il", "5"}, 10000, 100, 5, 10},
	} {
		o, err := parse(c.args, io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		if g := o.cfg; g.Iters != c.iters || g.Warmup != c.warm || g.ItersLarge != c.iLg || g.WarmupLarge != c.xLg {
			t.Errorf("%q: %d (%d warm-up), above 8 KiB %d (%d); want %d (%d), %d (%d)", c.args,
				g.Iters, g.Warmup, g.ItersLarge, g.WarmupLarge, c.iters, c.warm, c.iLg, c.xLg)
		}
	}
}

// OSU's -m takes MIN: for "min = MIN, max = default" (its help says so,
// osu_util_options.h, and osu_util.c's set_message_size reads it);
// bench/osu refused it.
func TestSizesMinOnly(t *testing.T) {
	for _, c := range []struct {
		args   []string
		lo, hi int
	}{
		{[]string{"-m", "1024:"}, 1024, 4 << 20},
		{[]string{"-test", "bw", "-m", "8:"}, 8, 4 << 20},
		{[]string{"-m", "64"}, 0, 64},
		{[]string{"-test", "bw", "-m", "2:128"}, 2, 128},
	} {
		o, err := parse(c.args, io.Discard)
		if err != nil || o.cfg.MinSize != c.lo || o.cfg.MaxSize != c.hi {
			t.Errorf("%q: sizes %d to %d, %v; want %d to %d", c.args, o.cfg.MinSize, o.cfg.MaxSize, err, c.lo, c.hi)
		}
	}
	for _, bad := range []string{":", "8M:", "1:2:3", "8388608:"} {
		if _, err := parse([]string{"-m", bad}, io.Discard); err == nil {
			t.Errorf("-m %q: no error", bad)
		}
	}
}
