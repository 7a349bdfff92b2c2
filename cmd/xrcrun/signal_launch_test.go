package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLaunchBrokenPipe: xrcrun ... | head -1. The reader of stdout goes
// away; the job ends as on SIGINT, with its cleanup (ranks ended,
// temporary directories removed), exit status 128+SIGPIPE. SIGPIPE killed
// the launcher outright.
func TestLaunchBrokenPipe(t *testing.T) {
	t.Parallel()
	xrcrun, rank := tools(t)
	tmp := t.TempDir()
	j := &xjob{t: t, id: fmt.Sprintf("t%d-%d", os.Getpid(), rand.IntN(1e9))} // for checkGone
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(xrcrun, "--job-id", j.id, "-n", "2", "--nodes", "2", "--grace", "1s", rank, "-lines", "1000000", "-hang")
	cmd.Env = append(envList(os.Environ(), slurmVars()...), "TMPDIR="+tmp)
	cmd.Stdout, cmd.Stderr = pw, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	// Read a line or so, then go away, as head does.
	buf := make([]byte, 4096)
	if _, err := io.ReadAtLeast(pr, buf, 200); err != nil {
		t.Fatalf("read stdout: %v\n%s", err, stderr.String())
	}
	pr.Close()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		cmd.Process.Signal(syscall.SIGQUIT)
		<-done
		t.Fatalf("xrcrun did not end within a minute of its stdout closing\n%s", stderr.String())
	}
	j.checkGone()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGPIPE) {
		t.Errorf("xrcrun: %v, want exit status 141\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "xrcrun: output closed (SIGPIPE)") || strings.Contains(stderr.String(), "failed") {
		t.Errorf("stderr:\n%s", stderr.String())
	}
	if left, _ := os.ReadDir(tmp); len(left) > 0 {
		t.Errorf("left in TMPDIR: %v", left)
	}
}

// TestLaunchForwardSignals: SIGUSR1 and SIGUSR2 sent to xrcrun reach every
// rank, and the job goes on. xrcrun ignored them.
func TestLaunchForwardSignals(t *testing.T) {
	t.Parallel()
	_, rank := tools(t)
	j := startJob(t, ".", nil, "-n", "4", "--nodes", "2", rank, "-hang", "-usr")
	checkRanks(t, j.waitLines(4, rankLine, time.Minute), 4, func(r int) int { return r / 2 })
	for _, sig := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2} {
		j.cmd.Process.Signal(sig)
		got := j.waitLines(4, regexp.MustCompile(`^rank \d got `+sig.String()+`$`), time.Minute)
		seen := map[string]bool{}
		for _, l := range got {
			seen[l] = true
		}
		if len(seen) != 4 {
			t.Errorf("%v: %q, want one line from each of 4 ranks", sig, got)
		}
	}
	j.cmd.Process.Signal(syscall.SIGINT)
	if st := j.wait(time.Minute); st != 130 {
		t.Errorf("exit status %d, want 130\n%s", st, j.stderr.String())
	}
}

// TestParseDurations: --timeout, --grace and --agent-timeout take Go
// durations or plain seconds; a bad value is a one-line error, not the
// usage. "--timeout 10" printed the whole usage.
func TestParseDurations(t *testing.T) {
	for _, c := range []struct {
		args                      []string
		timeout, grace, agentWait time.Duration
	}{
		{[]string{"p"}, 0, 3 * time.Second, time.Minute},
		{[]string{"--timeout", "10", "p"}, 10 * time.Second, 3 * time.Second, time.Minute},
		{[]string{"--timeout", "2.5", "--grace", "0", "p"}, 2500 * time.Millisecond, 0, time.Minute},
		{[]string{"--timeout", "1m30s", "--grace", "500ms", "--agent-timeout", "5", "p"}, 90 * time.Second, 500 * time.Millisecond, 5 * time.Second},
	} {
		var stderr bytes.Buffer
		cfg, err := parseLaunch(c.args, &stderr)
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if aw := cfg.agentTimeout(modeSSH); cfg.timeout != c.timeout || cfg.grace != c.grace || aw != c.agentWait {
			t.Errorf("%q: timeout %v grace %v agent-timeout %v, want %v %v %v", c.args, cfg.timeout, cfg.grace, aw,
				c.timeout, c.grace, c.agentWait)
		}
	}
	// Under Slurm an agent has as long as srun takes, unless the flag says
	// otherwise.
	for args, want := range map[string]time.Duration{"p": 0, "--agent-timeout 20s p": 20 * time.Second} {
		cfg, err := parseLaunch(strings.Fields(args), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.agentTimeout(modeSlurm); got != want {
			t.Errorf("%q under Slurm: agent timeout %v, want %v", args, got, want)
		}
	}
	for _, args := range [][]string{{"--timeout", "10x", "p"}, {"--timeout", "-5", "p"}, {"--grace", "NaN", "p"}, {"--nosuch", "p"}, {"--loss", "1.5", "p"}, {"--dup", "-0.1", "p"}, {"--reorder", "NaN", "p"}} {
		var stderr bytes.Buffer
		_, err := parseLaunch(args, &stderr)
		if err == nil || strings.Contains(err.Error(), "\n") || stderr.Len() > 0 {
			t.Errorf("%q: %v, with output %q; want a one-line error and no output", args, err, stderr.String())
		}
	}
	var stderr bytes.Buffer
	if _, err := parseLaunch([]string{"-h"}, &stderr); err == nil || !strings.Contains(stderr.String(), "-agent-timeout") {
		t.Errorf("-h: %v, output %q", err, stderr.String())
	}
}

// TestStartFailureCode: as in a shell, 127 for a program that is not
// there, 126 for one that cannot be executed.
func TestStartFailureCode(t *testing.T) {
	for _, c := range []struct {
		err  error
		code int
	}{
		{&fs.PathError{Op: "fork/exec", Path: "/x", Err: syscall.ENOENT}, 127},
		{&exec.Error{Name: "x", Err: exec.ErrNotFound}, 127},
		{&fs.PathError{Op: "fork/exec", Path: "/etc/passwd", Err: syscall.EACCES}, 126},
		{&fs.PathError{Op: "fork/exec", Path: "/x", Err: syscall.ENOEXEC}, 126},
	} {
		if got := startFailureCode(c.err); got != c.code {
			t.Errorf("%v: %d, want %d", c.err, got, c.code)
		}
	}
}

// TestLaunchForwardStop: SIGTSTP (Ctrl-Z) and SIGCONT sent to xrcrun are
// forwarded to the ranks, as mpirun does. Ranks lead process groups of
// their own, so the terminal's SIGTSTP reaches only xrcrun: unhandled, it
// stopped xrcrun and the ranks ran on. A job ended while its ranks are
// stopped ends at once, not after the grace period: the ranks get SIGCONT
// after SIGTERM.
func TestLaunchForwardStop(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	prog := dir + "/stop.sh"
	if err := os.WriteFile(prog, []byte("#!/bin/sh\necho pid $$\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	j := startJob(t, dir, nil, "-n", "2", "--grace", "10m", prog)
	var pids []int
	for _, l := range j.waitLines(2, regexp.MustCompile(`^pid \d+$`), time.Minute) {
		var pid int
		fmt.Sscanf(l, "pid %d", &pid)
		pids = append(pids, pid)
	}
	// state waits until every rank is (or is not) stopped.
	state := func(stopped bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
			n := 0
			for _, pid := range pids {
				b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
				if len(f) > 0 && (f[0] == "T") == stopped {
					n++
				}
			}
			if n == len(pids) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("ranks %v not stopped=%v within a minute\nstderr:\n%s", pids, stopped, j.stderr.String())
			}
		}
	}
	j.cmd.Process.Signal(syscall.SIGTSTP)
	state(true)
	j.cmd.Process.Signal(syscall.SIGCONT)
	state(false)
	j.cmd.Process.Signal(syscall.SIGTSTP)
	state(true)
	j.cmd.Process.Signal(syscall.SIGINT)
	if st := j.wait(time.Minute); st != 130 {
		t.Errorf("exit status %d, want 130\n%s", st, j.stderr.String())
	}
}
