package main

// The agent's guard kills what a node's ranks started if the agent is
// killed outright (SIGKILL, the OOM killer). A rank dies with its agent
// (Pdeathsig), but the processes it started live on in its process group,
// and nothing else on a remote node knows of them.
//
// Who owns what: the agent starts the ranks, each the leader of a process
// group, and owns those groups while it lives: it signals them and kills
// each once its leader has exited. It starts one guard (`xrcrun
// agent-guard`, not for people) and holds the write end of a pipe whose
// read end only the guard holds, and tells it, a line each, "+PGID" for
// every group it has started and "-PGID" for every group it has ended.
// The guard owns nothing while the agent lives. When the pipe reaches end
// of file (the agent has exited, however it did) it SIGKILLs the groups
// still started and exits; after an agent's ordinary end there are none.
// The guard is in a session of its own, does not die with the agent (no
// Pdeathsig) and ignores SIGINT, SIGTERM and SIGHUP: a signal to the
// agent, its process group or the terminal does not reach it.
//
// Numbers reused: the agent says "-PGID" while the group's leader is an
// unreaped zombie (waitid WNOWAIT), so the number is still the group's;
// after that the guard never uses it. What remains is the agent's death
// in the moment between a rank's start and its "+PGID" (the rank had no
// time to start anything), and a group that empties, and whose number a
// new group takes, between the agent's death and the guard's kill: that
// needs the system's process numbers to wrap around within it, and is
// accepted. A process that leaves its group (setsid, setpgid) is out of
// reach, as is everything if the guard is killed too.

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// guardCommand runs the guard: main dispatches it before it sets up any
// signal handling.
const guardCommand = "agent-guard"

// guard is the agent's side of its guard; a nil guard (it could not be
// started) does nothing.
type guard struct {
	w    *os.File // the pipe to the guard
	cmd  *exec.Cmd
	done chan struct{} // the guard has exited
	log  *slog.Logger
}

// startGuard starts the agent's guard.
func startGuard(log *slog.Logger) (*guard, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("guard: own path: %w", err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("guard: %w", err)
	}
	defer pr.Close()
	cmd := exec.Command(self, guardCommand)
	cmd.ExtraFiles = []*os.File{pr} // fd 3; standard input and output are /dev/null
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		pw.Close()
		return nil, fmt.Errorf("guard: start: %w", err)
	}
	g := &guard{w: pw, cmd: cmd, done: make(chan struct{}), log: log}
	go func() { cmd.Wait(); close(g.done) }()
	return g, nil
}

// started tells the guard of a process group the agent has started.
func (g *guard) started(pgid int) { g.say('+', pgid) }

// ended tells the guard of a process group the agent has ended: its
// leader has exited and not been reaped, and the group has been killed.
func (g *guard) ended(pgid int) { g.say('-', pgid) }

// say writes one line, in one write: lines of writers at once do not mix
// (a pipe takes up to PIPE_BUF bytes whole).
func (g *guard) say(op byte, pgid int) {
	if g == nil {
		return
	}
	line := append(strconv.AppendInt([]byte{op}, int64(pgid), 10), '\n')
	if _, err := g.w.Write(line); err != nil && !errors.Is(err, os.ErrClosed) {
		g.log.Warn("tell the guard", "err", err)
	}
}

// close ends the guard, which kills the groups not ended, and waits
// for it a while.
func (g *guard) close() {
	if g == nil {
		return
	}
	g.w.Close()
	select {
	case <-g.done:
	case <-time.After(10 * time.Second):
		g.log.Warn("guard did not exit", "pid", g.cmd.Process.Pid)
	}
}

// runGuard is the guard (`xrcrun agent-guard`), its pipe from the agent
// on fd 3.
func runGuard() int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	in := os.NewFile(3, "agent")
	if in == nil {
		return 2
	}
	live := map[int]bool{}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) < 2 {
			continue
		}
		pgid, err := strconv.Atoi(string(line[1:]))
		if err != nil || pgid <= 1 {
			continue
		}
		switch line[0] {
		case '+':
			live[pgid] = true
		case '-':
			delete(live, pgid)
		}
	}
	// End of file, or the pipe failed: the agent is gone.
	for pgid := range live {
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
	return 0
}
