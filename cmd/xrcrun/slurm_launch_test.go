package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeSrun records its arguments in $FAKE_SRUN_LOG and starts the command
// after its options once per task, here, with the task's SLURM_PROCID and
// SLURM_NODEID, as srun would on the nodes.
const fakeSrun = `#!/bin/sh
echo "$@" > "$FAKE_SRUN_LOG"
n=1
while [ $# -gt 0 ]; do
	case "$1" in
	--ntasks=*) n=${1#--ntasks=}; shift ;;
	--*) shift ;;
	*) break ;;
	esac
done
i=0
while [ $i -lt $n ]; do
	SLURM_PROCID=$i SLURM_NODEID=$i SLURM_STEP_ID=0 "$@" &
	i=$((i+1))
done
wait
`

func TestLaunchSlurm(t *testing.T) {
	t.Parallel()
	_, rank := tools(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "srun"), []byte(fakeSrun), 0o755); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "srun.log")
	// The allocation's "nodes" are loopback addresses, so that each node's
	// soft HCA has an address of its own on this machine.
	prefix := fmt.Sprintf("127.%d.%d.", 128+rand.IntN(128), rand.IntN(256))
	env := []string{
		"PATH=" + dir + ":" + os.Getenv("PATH"), "FAKE_SRUN_LOG=" + log,
		"SLURM_JOB_ID=4242", "SLURM_NODELIST=" + prefix + "[1-2]", "SLURM_NTASKS=6", "SLURM_TASKS_PER_NODE=4,2",
	}
	j := startJob(t, ".", env, rank)
	if st := j.wait(2 * time.Minute); st != 0 {
		t.Fatalf("exit status %d\n%s", st, j.stderr.String())
	}
	seen := checkRanks(t, strings.Split(strings.TrimSpace(j.out()), "\n"), 6, func(r int) int { return r / 4 })
	for r, ri := range seen {
		if want := []int{4, 2}[ri.node]; ri.localSize != want {
			t.Errorf("rank %d: %d ranks on node %d, want %d", r, ri.localSize, ri.node, want)
		}
	}
	args, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--nodes=2 ", "--ntasks=2 ", "--ntasks-per-node=1 ", "--nodelist=" + prefix + "[1-2] ", " agent\n"} {
		if !strings.Contains(string(args), want) {
			t.Errorf("srun arguments %q lack %q", args, want)
		}
	}

	// A failed rank ends the srun step too.
	j = startJob(t, ".", env, "-n", "4", rank, "-exit-rank", "3", "-code", "7")
	if st := j.wait(2 * time.Minute); st != 7 {
		t.Errorf("exit status %d, want 7\n%s", st, j.stderr.String())
	}
	if want := "* rank 3 (node 0, " + prefix + "1): exit status 7"; !strings.Contains(j.stderr.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, j.stderr.String())
	}
}

// TestLaunchSlurmLargeSpec: a job whose agents' spec is larger than one
// environment string may be (128 KiB on Linux: srun's environment carried
// it, and starting srun failed with E2BIG) runs under srun: 200 KiB of
// program arguments and -x variables.
func TestLaunchSlurmLargeSpec(t *testing.T) {
	t.Parallel()
	_, rank := tools(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "srun"), []byte(fakeSrun), 0o755); err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("127.%d.%d.", 128+rand.IntN(128), rand.IntN(256))
	env := []string{
		"PATH=" + dir + ":" + os.Getenv("PATH"), "FAKE_SRUN_LOG=" + filepath.Join(dir, "srun.log"),
		"SLURM_JOB_ID=4243", "SLURM_NODELIST=" + prefix + "[1-2]", "SLURM_TASKS_PER_NODE=2(x2)",
	}
	var args []string
	for i := range 500 {
		args = append(args, "-x", fmt.Sprintf("XRC_TEST_VAR_%d=%s", i, strings.Repeat("v", 200)))
	}
	args = append(args, rank)
	for range 500 {
		args = append(args, strings.Repeat("a", 200))
	}
	j := startJob(t, ".", env, args...)
	if st := j.wait(2 * time.Minute); st != 0 {
		t.Fatalf("exit status %d\n%s", st, j.stderr.String())
	}
	checkRanks(t, strings.Split(strings.TrimSpace(j.out()), "\n"), 4, func(r int) int { return r / 2 })
}
