package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gateSSH is an ssh command that runs the remote command here, as
// fakeSSH does for $FAKE_SSH_OK, but only once the file $GATE exists; it
// first logs the host in $GATE_LOG. The agents of a job it starts connect
// when the test opens the gate.
const gateSSH = `#!/bin/sh
while [ $# -gt 2 ]; do shift; done
echo "$1" >> "$GATE_LOG"
while [ ! -e "$GATE" ]; do sleep 0.05; done
exec sh -c "$2"
`

// gatedJob starts xrcrun on two hosts through gateSSH, with args before
// the program, and waits until both agents wait at the gate: the launcher
// is then past setting up its signals. It returns the job and the gate's
// opener.
func gatedJob(t *testing.T, args ...string) (*xjob, func()) {
	t.Helper()
	tools(t)
	dir := t.TempDir()
	ssh := filepath.Join(dir, "ssh")
	if err := os.WriteFile(ssh, []byte(gateSSH), 0o755); err != nil {
		t.Fatal(err)
	}
	gate, log := filepath.Join(dir, "gate"), filepath.Join(dir, "gate.log")
	prefix := fmt.Sprintf("127.%d.%d.", 128+rand.IntN(128), rand.IntN(256))
	j := startJob(t, ".", []string{"GATE=" + gate, "GATE_LOG=" + log},
		append([]string{"-H", prefix + "1," + prefix + "2", "--ssh", ssh}, args...)...)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(log); strings.Count(string(b), "\n") == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agents' ssh did not start within a minute")
		}
	}
	return j, func() {
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// letSignalIn gives the launcher a moment to take a signal before the gate
// opens. Only the code before the fix needs it to fail: whether a signal
// is taken before or after an agent connects, it must reach the agent.
func letSignalIn() { time.Sleep(time.Second) }

// TestLaunchInterruptBeforeConnect: SIGINT or SIGTERM before any agent
// has connected ends the job as it does once the ranks run: the agents
// that connect later end their ranks, and xrcrun exits with 128 plus the
// signal.
func TestLaunchInterruptBeforeConnect(t *testing.T) {
	t.Parallel()
	_, rank := tools(t)
	for _, c := range []struct {
		sig  syscall.Signal
		said string
	}{{syscall.SIGINT, "interrupted (SIGINT)"}, {syscall.SIGTERM, "terminated (SIGTERM)"}} {
		t.Run(c.sig.String(), func(t *testing.T) {
			t.Parallel()
			j, open := gatedJob(t, "--grace", "1s", rank, "-hang")
			j.cmd.Process.Signal(c.sig)
			letSignalIn()
			open()
			if st := j.wait(time.Minute); st != 128+int(c.sig) {
				t.Errorf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", st, 128+int(c.sig), j.out(), j.stderr.String())
			}
			if !strings.Contains(j.stderr.String(), "xrcrun: "+c.said) || strings.Contains(j.stderr.String(), "failed") {
				t.Errorf("stderr:\n%s", j.stderr.String())
			}
		})
	}
}

// TestLaunchUSR1BeforeConnect: SIGUSR1 sent to xrcrun before any agent
// has connected reaches the ranks once their agents have started them.
// The ranks are sleep, which SIGUSR1 kills (they cannot ignore it before
// a handler is in place, as a rank that handles it might): the job fails
// with 128+SIGUSR1. The signal was dropped and the job ran until
// --timeout.
func TestLaunchUSR1BeforeConnect(t *testing.T) {
	t.Parallel()
	j, open := gatedJob(t, "--timeout", "45s", "--grace", "1s", "sleep", "600")
	j.cmd.Process.Signal(syscall.SIGUSR1)
	letSignalIn()
	open()
	if st := j.wait(2 * time.Minute); st != 128+int(syscall.SIGUSR1) {
		t.Errorf("exit status %d, want %d\nstderr:\n%s", st, 128+int(syscall.SIGUSR1), j.stderr.String())
	}
	if want := "killed by signal 10 (user defined signal 1)"; !strings.Contains(j.stderr.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, j.stderr.String())
	}
}
