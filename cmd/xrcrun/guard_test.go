package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLaunchKilledAgentGrandchild: a node agent killed outright (SIGKILL,
// as the OOM killer does) on a node the launcher cannot reach itself (ssh,
// Slurm) leaves nothing the ranks started: its guard kills the ranks'
// process groups. Before the guard, the ranks died with their agent
// (Pdeathsig) and what they started in the background lived on.
func TestLaunchKilledAgentGrandchild(t *testing.T) {
	t.Parallel()
	_, _ = tools(t)
	for _, mode := range []string{"ssh", "slurm"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			prefix := fmt.Sprintf("127.%d.%d.", 128+rand.IntN(128), rand.IntN(256))
			var env, args []string
			switch mode {
			case "ssh":
				ssh := filepath.Join(dir, "ssh")
				if err := os.WriteFile(ssh, []byte(fakeSSH), 0o755); err != nil {
					t.Fatal(err)
				}
				env = []string{"FAKE_SSH_LOG=" + filepath.Join(dir, "ssh.log"), "FAKE_SSH_OK=" + prefix + "1", "FAKE_SSH_ASK=none"}
				args = []string{"-H", prefix + "1", "-n", "2", "--ssh", ssh}
			case "slurm":
				if err := os.WriteFile(filepath.Join(dir, "srun"), []byte(fakeSrun), 0o755); err != nil {
					t.Fatal(err)
				}
				env = []string{"PATH=" + dir + ":" + os.Getenv("PATH"), "FAKE_SRUN_LOG=" + filepath.Join(dir, "srun.log"),
					"SLURM_JOB_ID=4243", "SLURM_NODELIST=" + prefix + "1", "SLURM_NTASKS=2", "SLURM_TASKS_PER_NODE=2"}
				args = []string{"-n", "2"}
			}
			// Each rank starts a sleep in the background and waits for it.
			script := `sleep 600 & echo $! > "$0/child.$XRC_RANK.tmp" && mv "$0/child.$XRC_RANK.tmp" "$0/child.$XRC_RANK"; wait`
			j := startJob(t, ".", env, append(args, "--grace", "500ms", "sh", "-c", script, dir)...)
			var sleeps []int
			for r := range 2 {
				f := filepath.Join(dir, "child."+strconv.Itoa(r))
				for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
					b, err := os.ReadFile(f)
					if err == nil {
						pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
						if err != nil {
							t.Fatalf("%s: %v", f, err)
						}
						sleeps = append(sleeps, pid)
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("rank %d did not start its child\n%s", r, j.stderr.String())
					}
				}
			}
			// The agent: the parent of the rank that started the first sleep.
			agent := parentOf(t, parentOf(t, sleeps[0]))
			if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", agent)); !strings.HasSuffix(string(cmdline), "\x00agent\x00") {
				t.Fatalf("the ranks' parent %d is not an agent: %q", agent, cmdline)
			}
			if err := syscall.Kill(agent, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			for _, pid := range sleeps {
				for deadline := time.Now().Add(time.Minute); running(pid); time.Sleep(50 * time.Millisecond) {
					if time.Now().After(deadline) {
						syscall.Kill(pid, syscall.SIGKILL)
						t.Errorf("the ranks' child %d still runs a minute after their agent was killed", pid)
						break
					}
				}
			}
			if st := j.wait(2 * time.Minute); st == 0 {
				t.Errorf("exit status 0 after the node agent was killed\n%s", j.stderr.String())
			}
		})
	}
}

// TestGuard: when its pipe closes, the guard kills the process groups it
// was told were started and not those it was told had ended, and ignores
// SIGTERM meanwhile.
func TestGuard(t *testing.T) {
	t.Parallel()
	xrcrun, _ := tools(t)
	var groups []*exec.Cmd
	for range 2 {
		// A leader and, in its group, a child it does not wait for.
		c := exec.Command("sh", "-c", "sleep 600 & exec sleep 600")
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Kill(-c.Process.Pid, syscall.SIGKILL); c.Wait() })
		groups = append(groups, c)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	g := exec.Command(xrcrun, guardCommand)
	g.ExtraFiles = []*os.File{pr}
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	exited := make(chan error, 1)
	go func() { exited <- g.Wait() }()
	fmt.Fprintf(pw, "+%d\n+%d\n-%d\n", groups[0].Process.Pid, groups[1].Process.Pid, groups[1].Process.Pid)
	// SIGTERM once the guard ignores it (before, it would end it).
	for deadline := time.Now().Add(time.Minute); !ignores(g.Process.Pid, syscall.SIGTERM); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the guard does not ignore SIGTERM")
		}
	}
	g.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		t.Fatalf("the guard exited on SIGTERM: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	pw.Close()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("guard: %v", err)
		}
	case <-time.After(time.Minute):
		g.Process.Kill()
		t.Fatal("the guard did not exit a minute after its pipe closed")
	}
	// Group 0 was killed (its leader too: its Wait returns), group 1 not.
	done := make(chan error, 1)
	go func() { done <- groups[0].Wait() }()
	select {
	case err := <-done:
		if ws, ok := groups[0].ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Errorf("group 0's leader ended with %v, not SIGKILL", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("group 0, started and not ended, was not killed")
	}
	if err := syscall.Kill(-groups[1].Process.Pid, 0); err != nil {
		t.Errorf("group 1, ended, was signalled: %v", err)
	}
	if !running(groups[1].Process.Pid) {
		t.Error("group 1's leader, ended, was killed")
	}
}

// parentOf is pid's parent.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatal(err)
	}
	return ppid
}

// running says pid is a process that has not exited (not gone, not a
// zombie).
func running(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// ignores says process pid ignores sig (/proc/PID/status, SigIgn).
func ignores(pid int, sig syscall.Signal) bool {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, line := range strings.Split(string(b), "\n") {
		if mask, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			m, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64)
			return err == nil && m&(1<<(sig-1)) != 0
		}
	}
	return false
}
