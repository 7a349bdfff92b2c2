package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestRun runs each test in a world of one (no launcher) with few
// iterations and checks the table's rows: one per size, doubling from the
// smallest to -max; one for the barrier. It asserts nothing about the
// figures.
func TestRun(t *testing.T) {
	for _, c := range []struct {
		test  string
		sizes []string
	}{
		{"allreduce", []string{"8", "16", "32", "64"}},
		{"bcast", []string{"1", "2", "4", "8", "16", "32", "64"}},
		{"barrier", []string{"-"}},
		{"iallreduce", []string{"8", "16", "32", "64"}},
	} {
		var out, errb bytes.Buffer
		if err := run(context.Background(), []string{"-test", c.test, "-max", "64", "-i", "5", "-x", "1"}, &out, &errb); err != nil {
			t.Fatalf("%s: %v\n%s", c.test, err, errb.String())
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 2+len(c.sizes) || !strings.HasPrefix(lines[0], "# xrc "+c.test+", 1 ranks") {
			t.Fatalf("%s: table\n%s", c.test, out.String())
		}
		for i, want := range c.sizes {
			f := strings.Fields(lines[2+i])
			if c.test == "iallreduce" { // size, overall, compute, pure, overlap
				if len(f) != 5 || f[0] != want {
					t.Errorf("%s: row %q, want size %s", c.test, lines[2+i], want)
				}
				continue
			}
			if len(f) != 5 || f[0] != want || f[4] != "5" {
				t.Errorf("%s: row %q, want size %s and 5 iterations", c.test, lines[2+i], want)
			}
		}
	}
	var out, errb bytes.Buffer
	for _, args := range [][]string{{"-test", "gather"}, {"-test", "bcast", "-max", "0"}, {"-i", "0"}, {"extra"}} {
		if err := run(context.Background(), args, &out, &errb); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// -h prints the usage and exits 0, as asked; a bad flag exits 1 and says
// so.
func TestHelpStatus(t *testing.T) {
	var out, errb bytes.Buffer
	if got := status(run(context.Background(), []string{"-h"}, &out, &errb), &errb); got != 0 {
		t.Errorf("-h: exit status %d, stderr %q", got, errb.String())
	}
	if !strings.Contains(errb.String(), "-test") || strings.Contains(errb.String(), "help requested") {
		t.Errorf("-h printed %q, want the usage and no error", errb.String())
	}
	errb.Reset()
	if got := status(run(context.Background(), []string{"-bogus"}, &out, &errb), &errb); got != 1 || !strings.Contains(errb.String(), "coll:") {
		t.Errorf("-bogus: exit status %d, stderr %q", got, errb.String())
	}
}

// OSU's -i and -x set the iterations and warm-up of every size
// (osu_util.c's set_num_iterations and set_num_warmup set
// iterations_large and skip_large too): osu_bcast -i 5 makes 5 calls of
// 16 KiB, where bench/coll made its default 100. -il and -xl, which OSU
// does not have, still set the large sizes' apart.
func TestItersAllSizes(t *testing.T) {
	for _, c := range []struct {
		args  []string
		iters string // of the 16 KiB row
	}{
		{[]string{"-i", "5", "-x", "1"}, "5"},
		{[]string{"-i", "5", "-x", "1", "-il", "3", "-xl", "0"}, "3"},
		{[]string{"-il", "3", "-xl", "0", "-i", "5", "-x", "1"}, "3"},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"-test", "bcast", "-max", "16384"}, c.args...)
		if err := run(context.Background(), args, &out, &errb); err != nil {
			t.Fatalf("%q: %v\n%s", args, err, errb.String())
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		f := strings.Fields(lines[len(lines)-1])
		if len(f) != 5 || f[0] != "16384" || f[4] != c.iters {
			t.Errorf("%q: last row %q, want 16384 with %s iterations", args, lines[len(lines)-1], c.iters)
		}
	}
}
