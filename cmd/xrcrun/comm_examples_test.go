package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/xrcrun/xrc/comm"
)

// TestLaunchCommExamples runs the comm examples as jobs of real processes:
// a token around a ring, every rank sending checksummed messages of 0
// bytes to 1 MiB (eager and rendezvous) to every other, π by the
// collectives, on one node and on two emulated nodes over XRC, and
// bench/coll's Allreduce and, over XRC, Iallreduce, which check their
// sums, up to 64 KiB.
func TestLaunchCommExamples(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-n", "4", "./examples/ring", "-n", "100"}, "100 laps of 4 ranks"},
		{[]string{"-n", "1", "./examples/ring", "-n", "3", "-s", "65536"}, "3 laps of 1 ranks"},
		{[]string{"-n", "4", "./examples/alltoall", "-max", "1048576"}, "every checksum right"},
		{[]string{"-n", "3", "./examples/pi", "-n", "1000000"}, "pi is approximately 3.14159265358"},
		{[]string{"-n", "5", "--nodes", "2", "--transport", "xrc", "./examples/pi", "-n", "1000000"}, "1000000 intervals over 5 ranks"},
		{[]string{"-n", "3", "./bench/coll", "-test", "allreduce", "-max", "65536", "-i", "20", "-x", "2", "-il", "2", "-xl", "1"}, "  65536 "},
		{[]string{"-n", "3", "--nodes", "2", "--transport", "xrc", "./bench/coll", "-test", "iallreduce", "-max", "65536", "-i", "20", "-x", "2", "-il", "2", "-xl", "1"}, "  65536 "},
	} {
		j := startJob(t, "../..", nil, c.args...)
		if st := j.wait(3 * time.Minute); st != 0 {
			t.Fatalf("%v: exit status %d\n%s", c.args, st, j.stderr.String())
		}
		if out := j.out(); !strings.Contains(out, c.want) {
			t.Fatalf("%v: output %q does not say %q", c.args, out, c.want)
		}
	}
}

// TestConnectionReport runs 16 ranks on 4 emulated nodes. Over RC with
// eager connection alltoall's report shows c²(N−1) = 48 RC QPs per node;
// over XRC, c(N−1) = 12 INI and 12 TGT QPs. With lazy connection a ring
// only connects neighbours: the two ring links that leave each node (over
// XRC, one INI QP toward the next node and one TGT QP for the previous
// node's rank).
func TestConnectionReport(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args                 []string
		rcQPs, iniQPs, tgtQP int
	}{
		{[]string{"-n", "16", "--nodes", "4", "--transport", "rc", "--connect", "eager", "./examples/alltoall", "-max", "65536", "-json"}, 48, 0, 0},
		{[]string{"-n", "16", "--nodes", "4", "--transport", "rc", "--connect", "lazy", "./examples/ring", "-n", "5", "-json"}, 2, 0, 0},
		{[]string{"-n", "16", "--nodes", "4", "--transport", "xrc", "--connect", "eager", "./examples/alltoall", "-max", "65536", "-json"}, 0, 12, 12},
		{[]string{"-n", "16", "--nodes", "4", "--transport", "xrc", "--connect", "lazy", "./examples/ring", "-n", "5", "-json"}, 0, 2, 2},
	} {
		j := startJob(t, "../..", nil, c.args...)
		if st := j.wait(5 * time.Minute); st != 0 {
			t.Fatalf("%v: exit status %d\n%s", c.args, st, j.stderr.String())
		}
		var nodes []comm.NodeReport
		for _, line := range strings.Split(j.out(), "\n") {
			if strings.HasPrefix(line, "[") {
				if err := json.Unmarshal([]byte(line), &nodes); err != nil {
					t.Fatalf("%v: %v in %q", c.args, err, line)
				}
			}
		}
		if len(nodes) != 4 {
			t.Fatalf("%v: report of %d nodes:\n%s", c.args, len(nodes), j.out())
		}
		for _, n := range nodes {
			if n.Ranks != 4 || n.RCQPs != c.rcQPs || n.INIQPs != c.iniQPs || n.TGTQPs != c.tgtQP || n.SRQs != 4 || n.QueueBytes <= 0 {
				t.Errorf("%v: node %+v, want 4 ranks, %d RC QPs, %d INI and %d TGT QPs, 4 SRQs", c.args, n, c.rcQPs, c.iniQPs, c.tgtQP)
			}
		}
	}
}

// TestAlltoallLossy: 4 nodes of 4 ranks whose soft HCAs lose 5% of the
// packets they send exchange messages of 0 bytes to 4 MiB, every one
// checksummed, over RC and over XRC.
func TestAlltoallLossy(t *testing.T) {
	t.Parallel()
	for _, tr := range []string{"rc", "xrc"} {
		j := startJob(t, "../..", nil, "-n", "16", "--nodes", "4", "--transport", tr, "--connect", "eager",
			"--loss", "0.05", "--seed", "7", "./examples/alltoall", "-max", "4194304")
		if st := j.wait(10 * time.Minute); st != 0 {
			t.Fatalf("%s: exit status %d\n%s", tr, st, j.stderr.String())
		}
		if out := j.out(); !strings.Contains(out, "every checksum right") {
			t.Fatalf("%s: output %q", tr, out)
		}
	}
}

// TestAlltoall64 runs 64 ranks on 8 emulated nodes through alltoall over
// XRC, connected at start: 56 INI and 56 TGT QPs per node.
func TestAlltoall64(t *testing.T) {
	t.Parallel()
	j := startJob(t, "../..", nil, "-n", "64", "--nodes", "8", "--transport", "xrc", "--connect", "eager",
		"./examples/alltoall", "-max", "65536", "-json")
	if st := j.wait(10 * time.Minute); st != 0 {
		t.Fatalf("exit status %d\n%s", st, j.stderr.String())
	}
	var nodes []comm.NodeReport
	for _, line := range strings.Split(j.out(), "\n") {
		if strings.HasPrefix(line, "[") {
			if err := json.Unmarshal([]byte(line), &nodes); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(nodes) != 8 {
		t.Fatalf("report of %d nodes:\n%s", len(nodes), j.out())
	}
	for _, n := range nodes {
		if n.Ranks != 8 || n.INIQPs != 56 || n.TGTQPs != 56 || n.RCQPs != 0 {
			t.Errorf("node %+v, want 8 ranks, 56 INI and 56 TGT QPs", n)
		}
	}
}
