package main

import (
	"strings"
	"testing"
	"time"
)

// TestLaunchCommExamples runs the comm examples as jobs of real processes
// on one node: a token around a ring, and every rank sending checksummed
// messages of 0 bytes to 1 MiB (eager and rendezvous) to every other.
func TestLaunchCommExamples(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-n", "4", "./examples/ring", "-n", "100"}, "100 laps of 4 ranks"},
		{[]string{"-n", "4", "./examples/alltoall", "-max", "1048576"}, "every checksum right"},
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
