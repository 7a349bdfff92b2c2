package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/xrcrun/xrc/bootstrap"
)

// startAgents starts one agent per node: as child processes on this
// machine, through ssh on each host, or with one srun for the nodes of a
// Slurm allocation, each told boot (on its standard input, or in $XRC_AGENT
// under srun). Agents connect back on their own and get their spec then; a
// process that exits first is reported to the loop.
func (j *job) startAgents(ctx context.Context, boot agentBoot) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("launcher: own path, to run agents: %w", err)
	}
	jobEnv := bootstrap.EnvJobID + "=" + j.id
	switch j.mode {
	case modeLocal:
		for k := range j.place.Nodes {
			boot.Node = k
			cmd := exec.Command(self, "agent")
			cmd.Env = append(os.Environ(), jobEnv)
			if err := j.launch(cmd, fmt.Sprintf("agent of node %d", k), []int{k}, &boot); err != nil {
				return err
			}
		}
	case modeSSH:
		for k, nd := range j.place.Nodes {
			boot.Node = k
			argv := sshCommand(j.cfg.ssh, nd.Host, []string{"env", jobEnv, self, "agent"})
			cmd := exec.Command(argv[0], argv[1:]...)
			if err := j.launch(cmd, "ssh "+nd.Host, []int{k}, &boot); err != nil {
				return err
			}
		}
	case modeSlurm:
		boot.Node = -1
		b, err := json.Marshal(boot)
		if err != nil {
			return err
		}
		hosts := make([]string, len(j.place.Nodes))
		all := make([]int, len(j.place.Nodes))
		for k, nd := range j.place.Nodes {
			hosts[k], all[k] = nd.Host, k
		}
		argv := srunCommand(hosts, []string{self, "agent"})
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), jobEnv, envAgentBoot+"="+string(b))
		j.log.Debug("srun", "args", argv)
		if err := j.launch(cmd, "srun", all, nil); err != nil {
			return err
		}
	}
	return nil
}

// launch starts cmd, which runs the agents of nodes: in a process group of
// its own (so that a Ctrl-C at the terminal reaches only the launcher, which
// ends the job in order), its output on the launcher's stderr (that of ssh
// and srun held back until one of its agents has connected, for the
// failure report), and boot, if any, on its stdin. If the launcher dies, cmd gets SIGTERM:
// an agent then kills its ranks' process groups (SIGKILL would leave what
// the ranks started), ssh and srun end their remote side.
func (j *job) launch(cmd *exec.Cmd, what string, nodes []int, boot *agentBoot) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	// In order with the ranks' output, and never holding up the caller.
	out := &procLog{w: queueWriter{j.out, 2}, hold: true}
	cmd.Stdout, cmd.Stderr = out, out
	if j.mode == modeLocal {
		// An agent here writes to the launcher's stderr itself, not
		// through a pipe to the launcher: one whose launcher was killed
		// would die of SIGPIPE on its next log line, before it killed
		// its ranks' process groups.
		out.hold = false
		cmd.Stdout, cmd.Stderr = underlying(j.stderr), underlying(j.stderr)
	}
	// Something cmd started in the background (an ssh control master) may
	// keep its output open: Wait does not wait for that.
	cmd.WaitDelay = 5 * time.Second
	if boot != nil {
		b, err := json.Marshal(boot)
		if err != nil {
			return err
		}
		cmd.Stdin = strings.NewReader(string(b) + "\n")
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("launcher: start %s: %w", what, err)
	}
	p := &launched{what: what, nodes: nodes, pid: cmd.Process.Pid, out: out}
	j.procs = append(j.procs, p)
	go func() {
		err := cmd.Wait()
		j.post(event{kind: evExited, proc: p, err: err})
	}()
	return nil
}

// agentConnected passes on the output held back of the process that runs
// node's agent.
func (j *job) agentConnected(node int) {
	for _, p := range j.procs {
		if slices.Contains(p.nodes, node) && p.out.holding() {
			p.out.release()
		}
	}
}

// agentsLate fails the nodes whose agents have not connected within
// --agent-timeout (ssh or srun hangs: it cannot reach the host, it waits
// for an answer nobody gives), and ends the processes that should have
// started them: SIGCONT, as one that read the terminal was stopped.
func (j *job) agentsLate() {
	for _, p := range j.procs {
		late := false
		for _, k := range p.nodes {
			if j.hello[k].Load() { // connected, though its spec may still be on the way
				continue
			}
			late = true
			where := "host " + j.hostOf(k)
			if j.hostOf(k) == "" {
				where = fmt.Sprintf("node %d", k)
			}
			j.nodeLost(k, fmt.Sprintf("node agent on %s did not connect within %v (%s)%s",
				where, j.cfg.agentTimeout(j.mode), p.what, p.out.said()))
		}
		if late && !p.exited {
			syscall.Kill(-p.pid, syscall.SIGTERM)
			syscall.Kill(-p.pid, syscall.SIGCONT)
		}
	}
}

// procLog is the output of a process the launcher started: held back (its
// last maxHeld bytes) until release, then written to w.
type procLog struct {
	mu   sync.Mutex
	w    io.Writer
	hold bool
	held []byte
}

const maxHeld = 4 << 10

func (l *procLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.hold {
		l.w.Write(b) // an error here must not stop the process's output
		return len(b), nil
	}
	l.held = append(l.held, b...)
	if n := len(l.held); n > maxHeld {
		l.held = append(l.held[:0], l.held[n-maxHeld:]...)
	}
	return len(b), nil
}

func (l *procLog) holding() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.hold
}

// release writes what was held and lets what comes next through.
func (l *procLog) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hold {
		l.hold = false
		l.w.Write(l.held)
		l.held = nil
	}
}

// said is what was held, for a failure report: ": " and its last lines,
// joined by "; "; empty if nothing.
func (l *procLog) said() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lines []string
	for _, line := range strings.Split(string(l.held), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			lines = append(lines, line)
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return ": " + strings.Join(lines[max(0, len(lines)-5):], "; ")
}

// forwardSignals passes the signals main forwards (SIGUSR1, SIGUSR2,
// SIGTSTP, SIGCONT), if any, to the loop, which sends them to the ranks.
func (j *job) forwardSignals(ctx context.Context) {
	sigs, _ := ctx.Value(forwardKey{}).(<-chan os.Signal)
	if sigs == nil {
		return
	}
	go func() {
		for {
			select {
			case s := <-sigs:
				if n, ok := s.(syscall.Signal); ok && !j.post(event{kind: evSignal, sig: n}) {
					return
				}
			case <-j.quit:
				return
			}
		}
	}()
}

// forwardKey is the context key of the channel of signals to forward.
type forwardKey struct{}

// withForward returns ctx carrying sigs, the signals the launcher forwards
// to the ranks of its job.
func withForward(ctx context.Context, sigs <-chan os.Signal) context.Context {
	return context.WithValue(ctx, forwardKey{}, sigs)
}
