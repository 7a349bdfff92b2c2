package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/xrcrun/xrc/bootstrap"
)

// job is one run of the launcher: the job's agents, ranks and their fate.
// Its state belongs to the goroutine in loop; other goroutines talk to it
// through events.
type job struct {
	cfg     *launchConfig
	mode    launchMode
	id      string
	key     []byte
	place   placement
	program string
	log     *slog.Logger
	logw    *logWriter // where log writes, if the launcher set it (nil in tests)
	stdout  io.Writer
	stderr  io.Writer

	events chan event
	quit   chan struct{} // closed when the loop is over
	rdv    *bootstrap.Server
	spec   agentSpec // what every agent is told; nodeSpec adds its node's part
	// nodeAddr is the soft HCA address the launcher chose for node k; nil:
	// none, the agents choose.
	nodeAddr func(k int) string
	served   chan error               // what rdv.Serve returned
	hello    []atomic.Bool            // by node: its agent proved itself (accept); its spec may be on the way
	conns    []*ctrlConn              // by node, once its agent has its spec
	pending  map[int][]syscall.Signal // by node not in conns: signals to forward once it is
	procs    []*launched
	out      *output // the ranks' output, and the status line

	ready, started, done int
	rankDone             []bool
	quitAt               []int64 // when a rank exited with status 0 of itself (Unix ns), or 0
	rankPID              []int   // a started rank's pid, its process group's number (agents say)
	failures             []rankFailure
	cause                error // why the job ends early: a signalCause or a timeout; nil for a rank failure
	ending, byeSent      bool
	killC, hardC         <-chan time.Time
	drainC               <-chan time.Time
	lateC                <-chan time.Time // --agent-timeout: agents not connected by then are lost
}

// launched is a process the launcher started to run agents: an agent, the
// ssh that runs one, or srun.
type launched struct {
	what   string
	nodes  []int
	pid    int
	exited bool
	out    *procLog // its output
}

type eventKind int

const (
	evConnected eventKind = iota // an agent proved itself and has its spec: node, conn
	evNoSpec                     // node's agent proved itself, but did not get its spec: err
	evMessage                    // node sent msg
	evGone                       // node's connection ended: err
	evExited                     // proc exited: err
	evUnseen                     // proc exited a while ago: err; its nodes that never connected are lost
	evSignal                     // the launcher got sig, to forward to the ranks
)

type event struct {
	kind eventKind
	node int
	conn *ctrlConn
	msg  message
	err  error
	proc *launched
	sig  syscall.Signal
}

// errTimeout ends a job that ran past --timeout.
type errTimeout time.Duration

func (e errTimeout) Error() string   { return fmt.Sprintf("job timed out after %v", time.Duration(e)) }
func (e errTimeout) ExitStatus() int { return 124 }

func (j *job) run(ctx context.Context) error {
	host, err := j.controlHost(ctx)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return fmt.Errorf("launcher: control socket: %w", err)
	}
	defer ln.Close()
	rctx, stopRdv := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRdv()
	var rlog *slog.Logger // the failure report says what the server would log about an abort
	if j.cfg.verbose {
		rlog = j.log.With("part", "bootstrap")
	}
	j.rdv, err = listenRendezvous(rctx, net.JoinHostPort(host, "0"), len(j.place.Node), j.key, rlog)
	if err != nil {
		return fmt.Errorf("launcher: bootstrap server: %w", err)
	}
	defer j.rdv.Close()
	j.served = make(chan error, 1)
	go func() { j.served <- j.rdv.Serve(rctx) }()

	spec, cleanup, err := j.makeSpec()
	if err != nil {
		return err
	}
	defer cleanup()
	j.spec = spec
	// Each agent's spec is sealed when it says hello; the largest one now,
	// to fail before starting agents.
	largest := 0
	for k, rs := range j.place.Ranks {
		if len(rs) > len(j.place.Ranks[largest]) {
			largest = k
		}
	}
	if _, err := sealSpec(j.key, j.nodeSpec(largest)); err != nil {
		return fmt.Errorf("launcher: %w", err)
	}
	j.events = make(chan event, 256)
	j.quit = make(chan struct{})
	defer close(j.quit)
	j.hello = make([]atomic.Bool, len(j.place.Nodes))
	j.conns = make([]*ctrlConn, len(j.place.Nodes))
	j.trackRanks(len(j.place.Node))
	j.out = newOutput(j.stdout, j.stderr, j.cfg.tag, newStatusLine(j.stderr))
	if j.logw != nil {
		j.logw.set(queueWriter{j.out, 2})
	}
	go j.accept(ln)
	defer func() {
		for _, c := range j.conns {
			if c != nil {
				c.close()
			}
		}
	}()
	j.log.Debug("job", "ranks", len(j.place.Node), "nodes", len(j.place.Nodes), "control", ln.Addr(), "bootstrap", j.rdv.Addr())
	j.forwardSignals(ctx)
	boot := agentBoot{JobID: j.id, Key: j.key, Control: ln.Addr().String(), Verbose: j.cfg.verbose}
	if err := j.startAgents(ctx, boot); err != nil {
		j.killProcs()
		j.closeOutput(ctx, 0)
		return err
	}
	if d := j.cfg.agentTimeout(j.mode); d > 0 {
		j.lateC = time.After(d)
	}
	j.loop(ctx)
	j.out.stopStatus()
	// The ranks' output is written before the launcher reports and exits;
	// if the user asks to stop meanwhile, for at most the grace period.
	j.closeOutput(ctx, j.cfg.grace)
	j.blameCulprit()
	if err := failureReport(j.failures); err != nil {
		return err
	}
	if j.cause != nil {
		return j.cause
	}
	return nil
}

// controlHost is the address agents and ranks reach the launcher at.
func (j *job) controlHost(ctx context.Context) (string, error) {
	if j.cfg.addr != "" {
		return j.cfg.addr, nil
	}
	if j.mode == modeLocal {
		return "127.0.0.1", nil
	}
	// The source address of the route to the first host.
	h := j.place.Nodes[0].Host
	if _, after, ok := strings.Cut(h, "@"); ok {
		h = after
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp4", net.JoinHostPort(h, "4791"))
	if err != nil {
		return "", fmt.Errorf("launcher: no route to %s to listen on (give --addr): %w", h, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

// makeSpec is what every agent is told once connected, but its node's
// part (nodeSpec); cleanup removes the runtime directory of a job on this
// machine.
func (j *job) makeSpec() (agentSpec, func(), error) {
	cwd, _ := os.Getwd()
	env, missing := j.cfg.env.resolve(os.LookupEnv)
	for _, name := range missing { // as mpirun warns: a misspelt name is not silently dropped
		fmt.Fprintf(j.stderr, "xrcrun: warning: -x %s: not set in this environment; not passed to the ranks\n", name)
	}
	s := agentSpec{
		JobID: j.id, Bootstrap: j.rdv.Addr(), Size: len(j.place.Node),
		Program: j.program, Args: j.cfg.args, Dir: cwd, Env: env,
		Transport: j.cfg.transport, Connect: j.cfg.connect, Grace: j.cfg.grace,
		Faults: j.cfg.faults, Nodes: len(j.place.Nodes),
	}
	cleanup := func() {}
	if j.mode == modeLocal {
		dir, remove, err := makeTempDir("xrcrun-" + j.id + "-")
		if err != nil {
			return s, nil, fmt.Errorf("launcher: runtime directory: %w", err)
		}
		cleanup = remove
		s.RuntimeDir = dir
		s.Emulated = j.cfg.nodes > 0
		s.AddrFallback = j.cfg.baseAddr == ""
		base := j.cfg.baseAddr
		j.nodeAddr = func(k int) string { return emulatedAddr(base, k).String() }
	}
	return s, cleanup, nil
}

// nodeSpec is the spec of node k's agent: j.spec and the node's entry,
// nothing of the other nodes, so that what the launcher sends grows with
// the number of nodes, not its square.
func (j *job) nodeSpec(k int) agentSpec {
	s := j.spec
	s.Node, s.Nodes = k, len(j.place.Nodes)
	s.At = nodeAt{Host: j.place.Nodes[k].Host, Ranks: j.place.Ranks[k]}
	if j.nodeAddr != nil {
		s.At.Addr = j.nodeAddr(k)
	}
	return s
}

// emulatedAddr is the address of emulated node k: base plus k, or
// 127.0.1.1 plus k.
func emulatedAddr(base string, k int) netip.Addr {
	a := netip.AddrFrom4([4]byte{127, 0, 1, 1})
	if base != "" {
		a = netip.MustParseAddr(base)
	}
	for range k {
		a = a.Next()
	}
	return a
}

// accept takes agents' connections and checks who they are.
func (j *job) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			cc := newCtrlConn(c)
			nonce := make([]byte, 32)
			rand.Read(nonce)
			c.SetDeadline(time.Now().Add(30 * time.Second))
			if err := cc.send(message{T: msgChallenge, Nonce: nonce}); err != nil {
				c.Close()
				return
			}
			m, err := cc.recv()
			if err != nil || m.T != msgHello || m.Node < 0 || m.Node >= len(j.place.Nodes) ||
				!hmac.Equal(m.MAC, helloMAC(j.key, j.id, m.Node, nonce)) {
				j.log.Warn("refused a control connection", "from", c.RemoteAddr(), "err", err)
				c.Close()
				return
			}
			// The node's agent has connected (--agent-timeout), though
			// its spec is still to come.
			if !j.hello[m.Node].CompareAndSwap(false, true) {
				j.log.Warn("a second agent for a node; refused", "node", m.Node)
				c.Close()
				return
			}
			// Sealed now, dropped once sent: the launcher holds the specs
			// of the agents it is sending them to, not of every node.
			sealed, err := sealSpec(j.key, j.nodeSpec(m.Node))
			if err == nil {
				err = cc.sendSpec(sealed)
			}
			if err != nil {
				j.log.Warn("could not send an agent its spec", "node", m.Node, "err", err)
				c.Close()
				j.post(event{kind: evNoSpec, node: m.Node, err: err})
				return
			}
			c.SetDeadline(time.Time{})
			if !j.post(event{kind: evConnected, node: m.Node, conn: cc}) {
				c.Close()
			}
		}()
	}
}

// post hands ev to the loop, unless the loop is over.
func (j *job) post(ev event) bool {
	select {
	case j.events <- ev:
		return true
	case <-j.quit:
		return false
	}
}

// read relays node's messages to the loop.
func (j *job) read(node int, c *ctrlConn) {
	for {
		j.out.room(j.quit) // while output waits to be written, TCP holds the agent back
		m, err := c.recv()
		if err != nil {
			j.post(event{kind: evGone, node: node, err: err})
			return
		}
		if !j.post(event{kind: evMessage, node: node, msg: m}) {
			return
		}
	}
}

// closeOutput writes what output holds (output.close) and sends the log
// to stderr again.
func (j *job) closeOutput(ctx context.Context, grace time.Duration) {
	j.out.close(ctx, grace)
	if j.logw != nil {
		j.logw.set(j.stderr)
	}
}

// trackRanks sizes the state the loop keeps for each of n ranks.
func (j *job) trackRanks(n int) {
	j.rankDone = make([]bool, n)
	j.quitAt = make([]int64, n)
	j.rankPID = make([]int, n)
}

// hostOf names node k's host for reports.
func (j *job) hostOf(k int) string {
	return j.place.Nodes[k].Host
}

// blameCulprit puts first the failed rank that the bootstrap server saw
// abort the job or get lost, when several failed: the others may have
// failed because of it (a rank in a collective fails when the job is
// aborted), and their exits may have been seen first. A culprit that
// exited with status 0 on its own is not among the failures: it is added,
// first, with what the server said of it. The server's word comes once
// every rank has gone.
func (j *job) blameCulprit() {
	if len(j.failures) == 0 {
		return
	}
	var served error
	select {
	case served = <-j.served:
	case <-time.After(time.Second):
		return
	}
	ae := culprit(served)
	if ae == nil {
		return
	}
	first := j.failures[0].Time
	for _, f := range j.failures {
		first = min(first, f.Time)
	}
	for i := range j.failures {
		if j.failures[i].Rank == ae.Rank {
			j.failures[i].Time = first - 1
			return
		}
	}
	if r := ae.Rank; r < len(j.quitAt) && j.quitAt[r] != 0 {
		detail := "it ended the others: " + ae.Reason
		switch {
		case ae.Lost:
			detail = "it exited without leaving the job (no Finalize or Client.Close), which ended the others"
		case ae.Blamed:
			detail = "the rendezvous ended the job because of it: " + ae.Reason
		}
		node := j.place.Node[r]
		j.failures = append(j.failures, rankFailure{Rank: r, Node: node, Host: j.hostOf(node), Time: first - 1, Detail: detail})
	}
}
