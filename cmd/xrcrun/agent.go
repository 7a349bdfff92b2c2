package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// envAgentBoot carries the agent's boot line when it cannot come on
// standard input (agents started by srun).
const envAgentBoot = "XRC_AGENT"

// runAgent is the node agent, started by the launcher on each node (`xrcrun
// agent`, not for people): it reads its boot line, connects back to the
// launcher, which sends it its spec, brings up the node's device, starts
// the node's ranks and relays their output and exits, until the launcher
// says bye or goes away. Either way no rank of the node outlives it.
func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("xrcrun agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	boot, err := readBoot(os.Stdin)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	level := slog.LevelWarn
	if boot.Verbose {
		level = slog.LevelDebug
	}
	node := boot.Node
	if node < 0 {
		if node, err = slurmNodeIndex(os.Getenv); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})).With("job", boot.JobID, "node", node)
	runtime.GOMAXPROCS(1) // the device engine is one goroutine; see `xrcrun hca --procs`
	a := &agent{boot: boot, node: node, log: log, ranks: map[int]*rankProc{}}
	return a.run(ctx)
}

// readBoot reads the agent's boot line from $XRC_AGENT or, if unset, as
// one line of r.
func readBoot(r io.Reader) (agentBoot, error) {
	var boot agentBoot
	line := []byte(os.Getenv(envAgentBoot))
	os.Unsetenv(envAgentBoot) // not for the ranks
	if len(line) == 0 {
		br := bufio.NewReaderSize(r, 4<<10)
		var err error
		if line, err = br.ReadBytes('\n'); err != nil && len(line) == 0 {
			return boot, fmt.Errorf("read the boot line from standard input: %w", err)
		}
	}
	if err := json.Unmarshal(line, &boot); err != nil {
		return boot, fmt.Errorf("bad boot line: %w", err)
	}
	if boot.JobID == "" || boot.Control == "" || len(boot.Key) == 0 {
		return boot, errors.New("boot line lacks the job, the launcher's address or the key")
	}
	return boot, nil
}

// agent is one node's agent.
type agent struct {
	boot agentBoot
	spec agentSpec // from the launcher, once connected
	node int
	log  *slog.Logger
	conn *ctrlConn
	grd  *guard // kills the ranks' groups if the agent is killed; see guard.go

	mu          sync.Mutex
	ranks       map[int]*rankProc // the running ranks; guarded by mu
	terminating bool              // the launcher asked to end the ranks; guarded by mu
	wg          sync.WaitGroup    // rank supervisors
}

func (a *agent) run(ctx context.Context) error {
	if err := a.dial(ctx); err != nil {
		return err
	}
	defer a.conn.close()
	// Everything below ends when the launcher goes away or says bye.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	dev, err := setupDevice(ctx, a.spec, a.node, a.log)
	if err != nil {
		a.conn.send(message{T: msgFail, Err: err.Error()})
		return fmt.Errorf("agent: node %d: %w", a.node, err)
	}
	defer dev.close()
	host, _ := os.Hostname()
	if err := a.conn.send(message{T: msgReady, Device: dev.name, Addr: dev.addr, Host: host}); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	// Closed as run returns: the groups then not ended, of ranks finish
	// gave up on, the guard kills.
	if a.grd, err = startGuard(a.log); err != nil {
		a.log.Warn("no guard: what the ranks start outlives an agent killed outright", "err", err)
	}
	defer a.grd.close()
	ranks := a.spec.At.Ranks
	for local, r := range ranks {
		a.startRank(r, local, len(ranks), dev)
	}
	// Commands until bye; the connection closing (the launcher died) or a
	// signal to the agent kills the ranks.
	cmds := make(chan message)
	go func() {
		defer close(cmds)
		for {
			m, err := a.conn.recv()
			if err != nil {
				return
			}
			select {
			case cmds <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case m, ok := <-cmds:
			if !ok {
				a.log.Warn("launcher gone; killing the ranks")
				a.killAll(false)
				a.conn.close() // a send still waiting ends now
				return a.finish()
			}
			switch m.T {
			case msgTerm:
				a.terminate()
			case msgKill:
				a.killAll(true)
			case msgSignal:
				a.forward(syscall.Signal(m.Signal))
			case msgBye:
				return a.finish()
			default:
				a.log.Warn("unknown command", "type", m.T)
			}
		case <-ctx.Done():
			a.log.Warn("agent stopped; ending the ranks")
			go a.endRanks(false)
			return a.finish()
		}
	}
}

// dial connects to the launcher, proves the agent holds the job's key, and
// receives the spec.
func (a *agent) dial(ctx context.Context) error {
	d := net.Dialer{Timeout: 30 * time.Second, KeepAlive: 15 * time.Second}
	c, err := d.DialContext(ctx, "tcp", a.boot.Control)
	if err != nil {
		return fmt.Errorf("agent: connect to the launcher: %w", err)
	}
	a.conn = newAgentConn(c)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	m, err := a.conn.recv()
	c.SetReadDeadline(time.Time{})
	if err != nil || m.T != msgChallenge {
		c.Close()
		return fmt.Errorf("agent: no challenge from the launcher: %v", err)
	}
	mac := helloMAC(a.boot.Key, a.boot.JobID, a.node, m.Nonce)
	if err := a.conn.send(message{T: msgHello, Node: a.node, MAC: mac}); err != nil {
		c.Close()
		return fmt.Errorf("agent: hello: %w", err)
	}
	sealed, err := a.conn.recvSpec()
	if err == nil {
		a.spec, err = openSpec(a.boot.Key, a.boot.JobID, a.node, sealed)
	}
	if err != nil {
		c.Close()
		return fmt.Errorf("agent: %w", err)
	}
	a.log.Debug("spec", "bytes", len(sealed))
	return nil
}

// finish waits for the ranks' supervisors (which have reported every
// exit), bounded in case a rank cannot be reaped.
func (a *agent) finish() error {
	done := make(chan struct{})
	go func() { a.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(a.spec.Grace + 10*time.Second):
		a.log.Error("ranks not reaped; leaving")
	}
	return nil
}

// terminate ends the ranks as the launcher asked: SIGTERM, then SIGKILL
// after the grace period.
func (a *agent) terminate() {
	a.mu.Lock()
	a.terminating = true
	a.mu.Unlock()
	go a.endRanks(true)
}

// killAll SIGKILLs every rank now; asked says the launcher asked for it.
func (a *agent) killAll(asked bool) {
	a.mu.Lock()
	a.terminating = true
	for _, p := range a.ranks {
		p.signal(killSignal, asked)
	}
	a.mu.Unlock()
}

// endRanks sends SIGTERM to every rank, and SIGKILL to those still running
// after the grace period; asked says the launcher asked for it.
func (a *agent) endRanks(asked bool) {
	a.mu.Lock()
	for _, p := range a.ranks {
		p.signal(termSignal, asked)
		// A rank stopped (a forwarded SIGTSTP) acts on SIGTERM once
		// continued, not at the SIGKILL after the grace period.
		p.signal(syscall.SIGCONT, asked)
	}
	a.mu.Unlock()
	t := time.NewTimer(a.spec.Grace)
	defer t.Stop()
	done := make(chan struct{})
	go func() { a.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-t.C:
		a.killAll(asked)
	}
}

// envList removes the variables named in drop from env.
func envList(env []string, drop ...string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, d := range drop {
			keep = keep && name != d
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}
