package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xrcrun/xrc/bench/pt2pt"
)

// TestLaunchBenchOSU runs bench/osu as a job of two ranks on one node,
// each test with few iterations, and checks that the table has OSU's
// shape and every size from the smallest to 4 MiB; and that -json says
// the same sizes. It asserts nothing about the figures.
func TestLaunchBenchOSU(t *testing.T) {
	t.Parallel()
	few := []string{"-i", "20", "-x", "2", "-il", "2", "-xl", "1"}
	for _, c := range []struct {
		test  string
		title string
		col   string
		sizes []int
	}{
		{"latency", "Latency Test", "# Size          Latency (us)", pt2pt.Defaults(pt2pt.TestLatency).Sizes()},
		{"bw", "Bandwidth Test", "# Size      Bandwidth (MB/s)", pt2pt.Defaults(pt2pt.TestBandwidth).Sizes()},
	} {
		args := append([]string{"-n", "2", "./bench/osu", "-test", c.test}, few...)
		j := startJob(t, "../..", nil, args...)
		if st := j.wait(3 * time.Minute); st != 0 {
			t.Fatalf("%v: exit status %d\n%s", args, st, j.stderr.String())
		}
		out := j.out()
		lines := strings.Split(out, "\n")
		if len(lines) < 3 || !strings.Contains(lines[0], c.title) || !strings.Contains(lines[1], "one node") || lines[2] != c.col {
			t.Fatalf("%v: header of the table:\n%s", args, out)
		}
		rows, err := pt2pt.ParseTable(out)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		var sizes []int
		for _, r := range rows {
			sizes = append(sizes, r.Size)
		}
		if !slices.Equal(sizes, c.sizes) {
			t.Fatalf("%v: sizes %v, want %v\n%s", args, sizes, c.sizes, out)
		}

		args = append(args, "-json", "-m", "64:65536")
		j = startJob(t, "../..", nil, args...)
		if st := j.wait(3 * time.Minute); st != 0 {
			t.Fatalf("%v: exit status %d\n%s", args, st, j.stderr.String())
		}
		var rep pt2pt.Report
		if err := json.Unmarshal([]byte(j.out()), &rep); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, j.out())
		}
		sizes = sizes[:0]
		for _, r := range rep.Results {
			sizes = append(sizes, r.Size)
		}
		if string(rep.Test) != c.test || !rep.SameNode || !slices.Equal(sizes, []int{64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536}) {
			t.Fatalf("%v: %+v", args, rep)
		}
	}
}

// TestLaunchBenchOSUNodes runs bench/osu between two emulated nodes over
// RC and XRC. comm has no transport between nodes yet: until it has, the
// job fails with transport.ErrUnreachable's message and the test skips.
func TestLaunchBenchOSUNodes(t *testing.T) {
	t.Parallel()
	for _, tr := range []string{"rc", "xrc"} {
		t.Run(tr, func(t *testing.T) {
			args := []string{"-n", "2", "--nodes", "2", "--transport", tr, "./bench/osu", "-test", "latency",
				"-m", "65536", "-i", "20", "-x", "2", "-il", "2", "-xl", "1"}
			j := startJob(t, "../..", nil, args...)
			if st := j.wait(3 * time.Minute); st != 0 {
				if strings.Contains(j.stderr.String(), "rank not reachable by this transport") {
					t.Skipf("comm does not reach another node over %s yet:\n%s", tr, j.stderr.String())
				}
				t.Fatalf("%v: exit status %d\n%s", args, st, j.stderr.String())
			}
			out := j.out()
			if !strings.Contains(out, "two nodes, transport "+tr) {
				t.Errorf("%v: the table does not say where it ran:\n%s", args, out)
			}
			rows, err := pt2pt.ParseTable(out)
			if err != nil || len(rows) != 18 {
				t.Fatalf("%v: %d rows, %v\n%s", args, len(rows), err, out)
			}
		})
	}
}
