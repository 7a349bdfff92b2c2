package main

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLaunchKilledAgents: when the agents of several nodes are killed
// outright, the failure report names every lost node, not only the first
// the launcher saw go.
func TestLaunchKilledAgents(t *testing.T) {
	t.Parallel()
	_, rank := tools(t)
	j := startJob(t, ".", nil, "-n", "3", "--nodes", "3", "--grace", "500ms", rank, "-hang")
	ranks := checkRanks(t, j.waitLines(3, rankLine, time.Minute), 3, func(r int) int { return r })
	// The agents of nodes 1 and 2, the parents of their ranks: stopped
	// first, so that neither hears of the other's end before it is killed.
	var agents []int
	for _, r := range []int{1, 2} {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(ranks[r].pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		ppid, _ := strconv.Atoi(f[1])
		agents = append(agents, ppid)
	}
	for _, sig := range []syscall.Signal{syscall.SIGSTOP, syscall.SIGKILL} {
		for _, pid := range agents {
			if err := syscall.Kill(pid, sig); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st := j.wait(2 * time.Minute); st == 0 {
		t.Errorf("exit status 0 after two node agents were killed\n%s", j.stderr.String())
	}
	lost := regexp.MustCompile(`(?m)^\t\* rank (\d) \(node (\d)\): lost: its node agent went away$`)
	got := map[string]bool{}
	for _, m := range lost.FindAllStringSubmatch(j.stderr.String(), -1) {
		got[m[2]] = true
	}
	if !got["1"] || !got["2"] || len(got) != 2 || !strings.Contains(j.stderr.String(), "2 ranks failed:") {
		t.Errorf("the report does not name lost nodes 1 and 2 (%v):\n%s", got, j.stderr.String())
	}
}
