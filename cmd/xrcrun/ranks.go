package main

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	xunix "github.com/xrcrun/xrc/internal/unix"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/softhca"
)

const (
	termSignal = syscall.SIGTERM
	killSignal = syscall.SIGKILL
	outChunk   = 32 << 10 // output is relayed in pieces of at most this many bytes
)

// rankProc is a rank the agent started: the leader of a process group of
// its own, killed by the kernel if the agent dies (Pdeathsig).
type rankProc struct {
	rank     int
	cmd      *exec.Cmd
	signaled atomic.Bool // the launcher had the agent signal it
	exited   atomic.Bool
}

// signal sends sig to the rank's process group; asked says the launcher
// asked for it, so that the exit it causes is not a failure of the rank.
func (p *rankProc) signal(sig syscall.Signal, asked bool) {
	if p.exited.Load() {
		return
	}
	if asked && !zombie(p.cmd.Process.Pid) {
		p.signaled.Store(true)
	}
	syscall.Kill(-p.cmd.Process.Pid, sig)
}

// zombie says the process is exiting, has exited and waits to be reaped,
// or is gone: a signal sent now did not end it. The agent may not have reaped
// a rank yet when the launcher ends the job because of that very rank (or
// one that failed because of it), and that rank's exit must still count
// as a failure. The kernel marks a process exiting (PF_EXITING) before it
// closes its files: by the time the rendezvous sees the rank's connection
// end and fails the others, the rank is marked, though not yet a zombie
// (TestLaunchExitStatus lost rank 5's failure once in five runs so).
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		// Reaped already (ESRCH: between the open and the read), and its
		// supervisor is about to say so; unless there is no /proc.
		_, serr := os.Stat("/proc/self/stat")
		return serr == nil
	}
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')') // the command name may hold anything
	if i < 0 {
		return false
	}
	// After the name: state, ppid, pgrp, session, tty_nr, tpgid, flags.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 7 {
		return false
	}
	if f[0] == "Z" || f[0] == "X" {
		return true
	}
	const pfExiting = 0x4 // PF_EXITING, <linux/sched.h>
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&pfExiting != 0
}

// startRank starts rank r (local rank local of size on this node) and a
// supervisor that relays its output and reports its exit.
func (a *agent) startRank(r, local, size int, dev *nodeDevice) {
	s := a.spec
	env := bootstrap.Env{
		Rank: r, Size: s.Size, LocalRank: local, LocalSize: size, Node: a.node, Nodes: s.Nodes,
		Addr: s.Bootstrap, Key: s.Key, JobID: s.JobID, Transport: s.Transport, Connect: s.Connect, Device: dev.name,
	}
	cmd := exec.Command(s.Program, s.Args...)
	cmd.Env = append(append(append(envList(os.Environ(), envAgentBoot), s.Env...), env.Environ()...),
		softhca.RuntimeDirEnv+"="+dev.dir)
	if st, err := os.Stat(s.Dir); err == nil && st.IsDir() {
		cmd.Dir = s.Dir
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var pipes [2]*os.File // read ends: stdout, stderr
	var writers []*os.File
	for i := range pipes {
		pr, pw, err := os.Pipe()
		if err != nil {
			a.reportStartFailure(r, err)
			return
		}
		pipes[i] = pr
		writers = append(writers, pw)
	}
	cmd.Stdout, cmd.Stderr = writers[0], writers[1]
	p := &rankProc{rank: r, cmd: cmd}
	a.mu.Lock()
	if a.terminating {
		a.mu.Unlock()
		closeAll(append(writers, pipes[:]...))
		a.conn.send(message{T: msgExit, Rank: r, Code: -1, Signal: int(termSignal), Time: time.Now().UnixNano(), Terminated: true})
		return
	}
	err := cmd.Start()
	closeAll(writers)
	if err != nil {
		a.mu.Unlock()
		closeAll(pipes[:])
		a.reportStartFailure(r, err)
		return
	}
	a.ranks[r] = p
	a.wg.Add(1)
	a.mu.Unlock()
	a.grd.started(cmd.Process.Pid)
	a.conn.send(message{T: msgStarted, Rank: r, PID: cmd.Process.Pid})
	a.log.Debug("rank started", "rank", r, "pid", cmd.Process.Pid)

	var relay sync.WaitGroup
	var sending atomic.Int32 // relays waiting for the launcher to take output
	for i, pr := range pipes {
		relay.Add(1)
		go func() {
			defer relay.Done()
			defer pr.Close()
			a.relay(r, i+1, pr, &sending)
		}()
	}
	go func() {
		defer a.wg.Done()
		// Until the rank is reaped its group's number is its own: whatever
		// it left in its process group goes with it, and the guard forgets
		// the group, before the number is free. (Should waitid fail, the
		// rank is reaped first.)
		var werr error
		err := xunix.WaitExited(cmd.Process.Pid)
		if err != nil {
			a.log.Warn("rank", "rank", r, "err", err)
			werr = cmd.Wait()
		}
		at := time.Now().UnixNano()
		p.exited.Store(true)
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		a.grd.ended(cmd.Process.Pid)
		if err == nil {
			werr = cmd.Wait()
		}
		relayed := make(chan struct{})
		go func() { relay.Wait(); close(relayed) }()
		// A descendant outside the group may hold the pipes: they are
		// closed after 5 s of reading them, not counting the time the
		// launcher keeps the relays waiting (its stdout is not read), which
		// would cut off what the rank wrote.
		const step = 100 * time.Millisecond
		tick := time.NewTicker(step)
		for read := time.Duration(0); ; {
			select {
			case <-relayed:
			case <-tick.C:
				if sending.Load() == 0 {
					read += step
				}
				if read < 5*time.Second {
					continue
				}
				closeAll(pipes[:])
			}
			break
		}
		tick.Stop()
		m := message{T: msgExit, Rank: r, Time: at, Terminated: p.signaled.Load()}
		var ee *exec.ExitError
		switch {
		case werr == nil:
		case errors.As(werr, &ee):
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				m.Code, m.Signal = -1, int(ws.Signal())
			} else {
				m.Code = ee.ExitCode()
			}
		default:
			m.Code, m.Err = 1, werr.Error()
		}
		a.mu.Lock()
		delete(a.ranks, r)
		a.mu.Unlock()
		a.log.Debug("rank exited", "rank", r, "code", m.Code, "signal", m.Signal)
		if err := a.conn.send(m); err != nil {
			a.log.Warn("report exit", "rank", r, "err", err)
		}
	}()
}

// relay sends what a rank writes to stream (1 stdout, 2 stderr) to the
// launcher; sending counts the relays in a send.
func (a *agent) relay(r, stream int, pr io.Reader, sending *atomic.Int32) {
	buf := make([]byte, outChunk)
	for {
		n, err := pr.Read(buf)
		if n > 0 {
			sending.Add(1)
			serr := a.conn.send(message{T: msgOut, Rank: r, Stream: stream, Data: buf[:n]})
			sending.Add(-1)
			if serr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// reportStartFailure reports a rank that could not start as a shell
// reports a command it cannot run: exit status 127 if the program is not
// there, 126 if it is but cannot be executed (no permission, not an
// executable).
// The launcher prints the failure in its report of failed ranks, so the
// agent's own log has it at Info only (shown with -v), not a second time.
func (a *agent) reportStartFailure(r int, err error) {
	a.log.Info("start rank", "rank", r, "err", err)
	a.conn.send(message{T: msgExit, Rank: r, Code: startFailureCode(err), Err: "start: " + err.Error(), Time: time.Now().UnixNano()})
}

// startFailureCode is the exit status of a program that could not start
// with err: 127 not found, 126 otherwise.
func startFailureCode(err error) int {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, exec.ErrNotFound) {
		return 127
	}
	return 126
}

// forward sends sig, which the launcher got and forwards (SIGUSR1,
// SIGUSR2, SIGTSTP, SIGCONT), to every running rank's process group. A
// rank it kills failed, as one killed by the user would.
func (a *agent) forward(sig syscall.Signal) {
	switch sig {
	case syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTSTP, syscall.SIGCONT:
	default:
		a.log.Warn("not a signal to forward", "signal", int(sig))
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.ranks {
		p.signal(sig, false)
	}
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}
