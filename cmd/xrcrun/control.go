package main

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
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
// key. The launcher then sends the agent its spec, sealed under the key and
// bound to its node, in pieces (spec). Then the agent reports (ready, started, out, exit, fail)
// and the launcher commands (term, kill, signal, bye). When the connection
// closes, the agent kills its ranks and exits: no rank outlives its
// launcher.

// Message types.
const (
	msgChallenge = "challenge" // launcher: Nonce
	msgHello     = "hello"     // agent: Node, MAC
	msgSpec      = "spec"      // launcher: Data, a piece of the sealed spec; Last on the last one
	msgReady     = "ready"     // agent: its device is up: Device, Addr, Host
	msgStarted   = "started"   // agent: Rank, PID
	msgOut       = "out"       // agent: Rank, Stream (1 stdout, 2 stderr), Data
	msgExit      = "exit"      // agent: Rank, Code, Signal, Time, Terminated, Err
	msgFail      = "fail"      // agent: it cannot go on: Err
	msgTerm      = "term"      // launcher: SIGTERM the ranks, SIGKILL after the grace period
	msgKill      = "kill"      // launcher: SIGKILL the ranks now
	msgSignal    = "signal"    // launcher: send Signal (SIGUSR1, SIGUSR2, SIGTSTP, SIGCONT) to the ranks
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
	Last       bool   `json:"last,omitempty"` // the last piece of the spec
}

// maxLine bounds a control message (output comes in chunks of outChunk).
const maxLine = 1 << 20

// ctrlWriteTimeout is how long the launcher waits to send a command to an
// agent that does not read it: an agent reads its commands at once, so one
// that stopped reading is gone. A variable for tests.
var ctrlWriteTimeout = time.Minute

// ctrlConn is one end of a control connection; send and post are safe for
// concurrent use, recv is for one reader.
type ctrlConn struct {
	c       net.Conn
	mu      sync.Mutex // serializes send
	sc      *bufio.Scanner
	timeout time.Duration // bounds a send; 0: none

	// What post queues, for a goroutine of its own to send.
	qmu     sync.Mutex
	q       []message // guarded by qmu
	sending bool      // the sender goroutine runs; guarded by qmu
	qdone   bool      // a send failed: post drops; guarded by qmu
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

// post queues m to be sent by a goroutine of the connection's own, so
// that the launcher's loop never waits for an agent that does not read its
// commands (its host stopped, the agent is stopped): with one send after
// another, each waited up to ctrlWriteTimeout, for every such agent. A
// send that fails closes the connection, whose reader then reports the
// agent gone.
func (c *ctrlConn) post(m message) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if c.qdone {
		return
	}
	c.q = append(c.q, m)
	if !c.sending {
		c.sending = true
		go c.sendQueued()
	}
}

// sendQueued sends what post queued, in order, until the queue is empty.
func (c *ctrlConn) sendQueued() {
	for {
		c.qmu.Lock()
		q := c.q
		c.q = nil
		if len(q) == 0 || c.qdone {
			c.sending = false
			c.qmu.Unlock()
			return
		}
		c.qmu.Unlock()
		for _, m := range q {
			if err := c.send(m); err != nil {
				c.qmu.Lock()
				c.qdone, c.q, c.sending = true, nil, false
				c.qmu.Unlock()
				c.c.Close()
				return
			}
		}
	}
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

// The spec travels sealed with AES-GCM under a key derived from the job's:
// the control connection is plain TCP, and the spec says what the agent
// runs (only the launcher may say that) and holds the -x variables (which
// only the job may read). Each agent gets a spec of its own, with its
// node's entry only, sealed with its node number as associated data: the
// launcher's traffic grows with the number of nodes, not its square, and a
// spec sealed for one node does not open on another. It comes in pieces of
// specChunk bytes, so that a message stays within maxLine.
const specChunk = 64 << 10 // base64 in JSON: about 90 KB a message

// maxSpec bounds a sealed spec: the launcher does not send a larger one, an
// agent takes no more. specTimeout bounds the wait for the whole of it.
// Variables for tests.
var (
	maxSpec     = 64 << 20
	specTimeout = 2 * time.Minute
)

// specAEAD is the cipher that seals the spec of job under key.
func specAEAD(key []byte, jobID string) (cipher.AEAD, error) {
	h := hmac.New(sha256.New, key)
	h.Write([]byte("xrcrun spec\x00" + jobID))
	b, err := aes.NewCipher(h.Sum(nil))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// specAD is the associated data of node's spec: it binds the spec to the
// node it was sealed for.
func specAD(node int) []byte {
	return []byte("xrcrun spec for node " + strconv.Itoa(node))
}

// sealSpec is spec, without its key, encrypted and authenticated under
// key for node spec.Node: a random nonce followed by the sealed JSON.
func sealSpec(key []byte, spec agentSpec) ([]byte, error) {
	spec.Key = nil
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	aead, err := specAEAD(key, spec.JobID)
	if err != nil {
		return nil, err
	}
	if n := aead.NonceSize() + len(b) + aead.Overhead(); n > maxSpec {
		return nil, fmt.Errorf("the spec of node %d is %d bytes, more than %d (the program's arguments, -x, the node's ranks)", spec.Node, n, maxSpec)
	}
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(b)+aead.Overhead())
	rand.Read(nonce)
	return aead.Seal(nonce, nonce, b, specAD(spec.Node)), nil
}

// openSpec checks and decrypts what sealSpec sealed for node of the job;
// the spec gets the key.
func openSpec(key []byte, jobID string, node int, sealed []byte) (agentSpec, error) {
	var spec agentSpec
	aead, err := specAEAD(key, jobID)
	if err != nil {
		return spec, err
	}
	if len(sealed) < aead.NonceSize()+aead.Overhead() {
		return spec, errors.New("spec: too short")
	}
	ns := aead.NonceSize()
	b, err := aead.Open(nil, sealed[:ns], sealed[ns:], specAD(node))
	if err != nil {
		return spec, fmt.Errorf("spec: not sealed with the job's key for node %d", node)
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return spec, fmt.Errorf("spec: %w", err)
	}
	if spec.JobID != jobID {
		return spec, fmt.Errorf("spec: of job %q, not %q", spec.JobID, jobID)
	}
	if spec.Node != node || node >= spec.Nodes {
		return spec, fmt.Errorf("spec: of node %d of %d, not %d", spec.Node, spec.Nodes, node)
	}
	spec.Key = key
	return spec, nil
}

// sendSpec sends the sealed spec in pieces.
func (c *ctrlConn) sendSpec(sealed []byte) error {
	for {
		n := min(len(sealed), specChunk)
		m := message{T: msgSpec, Data: sealed[:n], Last: n == len(sealed)}
		if err := c.send(m); err != nil {
			return err
		}
		if m.Last {
			return nil
		}
		sealed = sealed[n:]
	}
}

// recvSpec receives the pieces of a sealed spec: at most maxSpec bytes,
// all within specTimeout. Every piece but the last has data.
func (c *ctrlConn) recvSpec() ([]byte, error) {
	defer c.c.SetReadDeadline(time.Time{})
	c.c.SetReadDeadline(time.Now().Add(specTimeout))
	var sealed []byte
	for {
		m, err := c.recv()
		if err != nil {
			return nil, fmt.Errorf("receive the spec: %w", err)
		}
		if m.T != msgSpec {
			return nil, fmt.Errorf("receive the spec: got %q", m.T)
		}
		if len(m.Data) == 0 && !m.Last {
			return nil, errors.New("receive the spec: an empty piece")
		}
		if len(m.Data) > maxSpec-len(sealed) {
			return nil, fmt.Errorf("receive the spec: more than %d bytes", maxSpec)
		}
		sealed = append(sealed, m.Data...)
		if m.Last {
			return sealed, nil
		}
	}
}

// agentBoot is what an agent is started with: enough to reach the launcher
// and prove that it belongs to the job. The launcher writes it as one JSON
// line to the agent's standard input, or puts it in $XRC_AGENT for agents
// started by srun (one environment string is limited to 128 KiB: the spec,
// whose node list grows with the job, comes over the control connection).
type agentBoot struct {
	JobID   string `json:"job"`
	Key     []byte `json:"key"`
	Control string `json:"control"` // the launcher's control address, host:port
	Node    int    `json:"node"`    // -1: from Slurm's task number
	Verbose bool   `json:"verbose,omitempty"`
}

// agentSpec is what an agent is told once it has connected: the job, its
// node, and how to run its node's ranks. The launcher sends it sealed
// (sealSpec) after the agent's hello, without the key, which the agent
// has already. It holds the agent's node only, not the others: their
// count is all an agent needs of them (ranks find each other through the
// bootstrap server).
type agentSpec struct {
	JobID     string   `json:"job"`
	Key       []byte   `json:"key,omitempty"` // from agentBoot; never sent
	Bootstrap string   `json:"bootstrap"`     // the rendezvous server, host:port
	Node      int      `json:"node"`          // the agent's node number
	At        nodeAt   `json:"at"`            // the agent's node
	Nodes     int      `json:"nodes"`         // the number of nodes of the job
	Size      int      `json:"size"`          // the number of ranks of the job
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
	Faults softhca.Faults `json:"faults"`
}

// nodeAt is a node of the job as its agent sees it.
type nodeAt struct {
	Host  string `json:"host,omitempty"` // the host; empty: this machine
	Addr  string `json:"addr,omitempty"` // the soft HCA's address, if the launcher chose it
	Ranks []int  `json:"ranks"`
}
