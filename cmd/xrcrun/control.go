package main

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/xrcrun/xrc/softhca"
)

// The control protocol between the launcher and its node agents: one TCP
// connection per agent, which the agent opens to the launcher, carrying
// JSON messages one per line. The launcher opens with a challenge; the
// agent answers with its node and an HMAC of the challenge under the job's
// key. Then the agent reports (ready, started, out, exit, fail) and the
// launcher commands (term, kill, signal, bye). When the connection closes,
// the agent kills its ranks and exits: no rank outlives its launcher.

// Message types.
const (
	msgChallenge = "challenge" // launcher: Nonce
	msgHello     = "hello"     // agent: Node, MAC
	msgReady     = "ready"     // agent: its device is up: Device, Addr, Host
	msgStarted   = "started"   // agent: Rank, PID
	msgOut       = "out"       // agent: Rank, Stream (1 stdout, 2 stderr), Data
	msgExit      = "exit"      // agent: Rank, Code, Signal, Time, Terminated, Err
	msgFail      = "fail"      // agent: it cannot go on: Err
	msgTerm      = "term"      // launcher: SIGTERM the ranks, SIGKILL after the grace period
	msgKill      = "kill"      // launcher: SIGKILL the ranks now
	msgSignal    = "signal"    // launcher: send Signal (SIGUSR1, SIGUSR2) to the ranks
	msgBye       = "bye"       // launcher: the job is over; stop the device and exit
)

// message is one line of the control protocol; which fields mean something
// depends on T.
type message struct {
	T          string `json:"t"`
	Node       int    `json:"node,omitempty"`
	Rank       int    `json:"rank,omitempty"`
	Nonce      []byte `json:"nonce,omitempty"`
	MAC        []byte `json:"mac,omitempty"`
	Device     string `json:"device,omitempty"`
	Addr       string `json:"addr,omitempty"`
	Host       string `json:"host,omitempty"`
	PID        int    `json:"pid,omitempty"`
	Stream     int    `json:"stream,omitempty"`
	Data       []byte `json:"data,omitempty"`
	Code       int    `json:"code,omitempty"`   // exit status; -1 when killed by a signal
	Signal     int    `json:"signal,omitempty"` // the signal that killed the rank
	Time       int64  `json:"time,omitempty"`   // when the agent saw the exit, Unix ns
	Terminated bool   `json:"terminated,omitempty"`
	Err        string `json:"err,omitempty"`
}

// maxLine bounds a control message (output comes in chunks of outChunk).
const maxLine = 1 << 20

// ctrlWriteTimeout is how long the launcher waits to send a command to an
// agent that does not read it: an agent reads its commands at once, so one
// that stopped reading is gone. A variable for tests.
var ctrlWriteTimeout = time.Minute

// ctrlConn is one end of a control connection; send is safe for
// concurrent use, recv is for one reader.
type ctrlConn struct {
	c       net.Conn
	mu      sync.Mutex // serializes send
	sc      *bufio.Scanner
	timeout time.Duration // bounds a send; 0: none
}

// newCtrlConn is the launcher's end of a control connection: a send waits
// at most ctrlWriteTimeout.
func newCtrlConn(c net.Conn) *ctrlConn {
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	return &ctrlConn{c: c, sc: sc, timeout: ctrlWriteTimeout}
}

// newAgentConn is an agent's end. Its sends wait as long as they must:
// the launcher stops reading while its stdout is not read (a paused pager),
// and TCP's flow control then holds back the agent, and the ranks with it,
// for as long as that lasts. A launcher that exited closed the connection,
// which ends a send at once; one whose host is gone, TCP's retransmission
// timeout.
func newAgentConn(c net.Conn) *ctrlConn {
	cc := newCtrlConn(c)
	cc.timeout = 0
	return cc
}

func (c *ctrlConn) send(m message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timeout > 0 {
		c.c.SetWriteDeadline(time.Now().Add(c.timeout))
	}
	_, err = c.c.Write(append(b, '\n'))
	return err
}

func (c *ctrlConn) recv() (message, error) {
	if !c.sc.Scan() {
		if err := c.sc.Err(); err != nil {
			return message{}, err
		}
		return message{}, net.ErrClosed
	}
	var m message
	if err := json.Unmarshal(c.sc.Bytes(), &m); err != nil {
		return message{}, fmt.Errorf("control: bad message: %w", err)
	}
	return m, nil
}

func (c *ctrlConn) close() error { return c.c.Close() }

// helloMAC proves that the agent of node holds the job's key.
func helloMAC(key []byte, jobID string, node int, nonce []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte("xrcrun agent\x00" + jobID + "\x00" + strconv.Itoa(node) + "\x00"))
	h.Write(nonce)
	return h.Sum(nil)
}

// agentSpec is what an agent is told: the job, its node, and how to run
// the node's ranks. The launcher writes it as one JSON line to the agent's
// standard input, or in $XRC_AGENT_SPEC for agents started by srun.
type agentSpec struct {
	JobID     string   `json:"job"`
	Key       []byte   `json:"key"`
	Control   string   `json:"control"`   // the launcher's control address, host:port
	Bootstrap string   `json:"bootstrap"` // the rendezvous server, host:port
	Node      int      `json:"node"`      // -1: from Slurm's task number
	Nodes     []nodeAt `json:"nodes"`
	Size      int      `json:"size"`
	Program   string   `json:"program"`
	Args      []string `json:"args"`
	Dir       string   `json:"dir"` // the ranks' working directory, if it exists on the node
	Env       []string `json:"env"` // NAME=value set for every rank (-x)
	Transport string   `json:"transport"`
	Connect   string   `json:"connect"`
	// RuntimeDir is where the node's soft HCA puts its socket; empty: the
	// agent makes a directory of its own and removes it when it exits.
	RuntimeDir string `json:"runtime_dir,omitempty"`
	// Emulated nodes always run a soft HCA, on Addr of their nodeAt, or
	// (AddrFallback) on a free loopback address if that one is taken.
	// Other nodes use the host's first kernel RDMA device, else a soft HCA
	// on the host's address.
	Emulated     bool          `json:"emulated,omitempty"`
	AddrFallback bool          `json:"addr_fallback,omitempty"`
	Grace        time.Duration `json:"grace"`
	// Faults are injected in the soft HCAs the agents start (node K's
	// seeded with Seed+K).
	Faults  softhca.Faults `json:"faults"`
	Verbose bool           `json:"verbose,omitempty"`
}

// nodeAt is a node of the job as agents see it.
type nodeAt struct {
	Host  string `json:"host,omitempty"` // the host; empty: this machine
	Addr  string `json:"addr,omitempty"` // the soft HCA's address, if the launcher chose it
	Ranks []int  `json:"ranks"`
}
