package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestControlHandshake: the launcher takes an agent that proves it holds
// the job's key for a node of the job, and nothing else; the one it takes
// gets the spec.
func TestControlHandshake(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	j := &job{id: "j1", key: key, spec: agentSpec{JobID: "j1", Program: "prog"},
		place: placement{Nodes: make([]node, 2), Ranks: [][]int{{0}, {1}}, Node: []int{0, 1}},
		log:   slog.New(slog.NewTextHandler(io.Discard, nil)), hello: make([]atomic.Bool, 2),
		events: make(chan event, 4), quit: make(chan struct{})}
	defer close(j.quit)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go j.accept(ln)
	hello := func(node int, mac func(nonce []byte) []byte) bool {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cc := newCtrlConn(c)
		m, err := cc.recv()
		if err != nil || m.T != msgChallenge || len(m.Nonce) != 32 {
			t.Fatalf("challenge %+v, %v", m, err)
		}
		cc.send(message{T: msgHello, Node: node, MAC: mac(m.Nonce)})
		b, err := cc.recvSpec()
		if err != nil { // the launcher hung up: refused
			return false
		}
		if spec, err := openSpec(key, "j1", node, b); err != nil || spec.Program != "prog" || string(spec.Key) != string(key) ||
			spec.Node != node || spec.Nodes != 2 || len(spec.At.Ranks) != 1 || spec.At.Ranks[0] != node {
			t.Errorf("spec %+v, %v", spec, err)
		}
		select {
		case ev := <-j.events:
			if ev.kind != evConnected || ev.node != node {
				t.Errorf("event %+v", ev)
			}
			ev.conn.close()
			return true
		case <-time.After(time.Minute):
			t.Fatal("neither accepted nor refused")
			return false
		}
	}
	good := func(node int) func([]byte) []byte {
		return func(n []byte) []byte { return helloMAC(key, "j1", node, n) }
	}
	if !hello(1, good(1)) {
		t.Error("an agent with the key was refused")
	}
	for name, c := range map[string]struct {
		node int
		mac  func([]byte) []byte
	}{
		"wrong key":      {0, func(n []byte) []byte { return helloMAC([]byte("another key, as long as the other"), "j1", 0, n) }},
		"wrong job":      {0, func(n []byte) []byte { return helloMAC(key, "j2", 0, n) }},
		"another node":   {0, good(1)},
		"no such node":   {2, good(2)},
		"stale nonce":    {0, func([]byte) []byte { return helloMAC(key, "j1", 0, make([]byte, 32)) }},
		"no proof":       {0, func([]byte) []byte { return nil }},
		"negative node":  {-1, good(-1)},
		"a second agent": {1, good(1)}, // node 1 has connected
	} {
		if hello(c.node, c.mac) {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestEnvFlag(t *testing.T) {
	var e envFlag
	for _, v := range []string{"A", "B=2", "C", "D=x=y"} {
		if err := e.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{"", "=1", "A B"} {
		if err := e.Set(bad); err == nil {
			t.Errorf("-x %q accepted", bad)
		}
	}
	env := map[string]string{"A": "1", "B": "ignored"}
	got, missing := e.resolve(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if len(missing) != 1 || missing[0] != "C" {
		t.Errorf("missing %q, want [C]", missing)
	}
	want := []string{"A=1", "B=2", "D=x=y"}
	if len(got) != len(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}

// TestSpecTransfer: a spec larger than a control message comes in pieces;
// one sealed under another key, or of another job, or for another node, or
// too large, is refused.
func TestSpecTransfer(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	spec := agentSpec{JobID: "j1", Program: "prog", Node: 3, Nodes: 5, At: nodeAt{Host: "node3", Ranks: []int{6, 7}}}
	for k := range 80000 {
		spec.Env = append(spec.Env, fmt.Sprintf("VAR%06d=value", k))
	}
	sealed, err := sealSpec(key, spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(sealed) < maxLine {
		t.Fatalf("the spec is %d bytes: too small for the test", len(sealed))
	}
	got, err := transferSpec(func(c *ctrlConn) error { return c.sendSpec(sealed) })
	if err != nil {
		t.Fatal(err)
	}
	back, err := openSpec(key, "j1", 3, got)
	if err != nil || len(back.Env) != len(spec.Env) || back.Env[79999] != "VAR079999=value" || back.At.Ranks[1] != 7 || back.Nodes != 5 {
		t.Fatalf("spec back: %v", err)
	}
	if _, err := openSpec([]byte("another key, as long as the other"), "j1", 3, got); err == nil {
		t.Error("opened under another key")
	}
	if _, err := openSpec(key, "j2", 3, got); err == nil {
		t.Error("opened as another job's")
	}
	if _, err := openSpec(key, "j1", 4, got); err == nil {
		t.Error("opened as another node's")
	}
	got[len(got)/2] ^= 1
	if _, err := openSpec(key, "j1", 3, got); err == nil {
		t.Error("opened a spec changed on the way")
	}
	// A peer that sends more than maxSpec is cut off at maxSpec; the
	// launcher does not seal more.
	defer func(n int) { maxSpec = n }(maxSpec)
	maxSpec = 4 << 20
	chunk := make([]byte, specChunk)
	_, err = transferSpec(func(c *ctrlConn) error {
		for {
			if err := c.send(message{T: msgSpec, Data: chunk}); err != nil {
				return err
			}
		}
	})
	if err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("an endless spec: %v", err)
	}
	if _, err := sealSpec(key, agentSpec{JobID: "j1", Args: []string{strings.Repeat("a", maxSpec)}}); err == nil {
		t.Error("sealed a spec larger than maxSpec")
	}
}

// transferSpec is what recvSpec receives of what send sends.
func transferSpec(send func(*ctrlConn) error) ([]byte, error) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() { send(newCtrlConn(a)); a.Close() }()
	return newAgentConn(b).recvSpec()
}

// TestSpecEndless: a launcher that sends empty pieces without end, or
// trickles pieces one byte at a time, does not keep an agent waiting past
// specTimeout.
func TestSpecEndless(t *testing.T) {
	defer func(d time.Duration) { specTimeout = d }(specTimeout)
	specTimeout = time.Second
	start := time.Now()
	_, err := transferSpec(func(c *ctrlConn) error {
		for {
			if err := c.send(message{T: msgSpec}); err != nil {
				return err
			}
		}
	})
	if err == nil {
		t.Error("took endless empty pieces")
	}
	_, err = transferSpec(func(c *ctrlConn) error {
		for {
			if err := c.send(message{T: msgSpec, Data: []byte{1}}); err != nil {
				return err
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	if err == nil {
		t.Error("took a spec trickling in without end")
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("gave up after %v; specTimeout is %v", d, specTimeout)
	}
}

// TestSpecSizeScaling: an agent is sent its node's entry, not the whole
// node list: the spec of a node of a 30000-node job, 64 ranks a node, is
// as small as that of a node of a 2-node job, and the launcher sends the
// 30000 agents about 30000 times that, not 30000² nodes' entries.
func TestSpecSizeScaling(t *testing.T) {
	const ppn = 64
	key := []byte("0123456789abcdef0123456789abcdef")
	jobOf := func(nodes int) *job {
		j := &job{id: "j1", key: key, spec: agentSpec{JobID: "j1", Program: "prog", Args: []string{"-n", "1"}, Env: []string{"A=1"}}}
		for k := range nodes {
			j.place.Nodes = append(j.place.Nodes, node{Host: fmt.Sprintf("node%05d", k)})
			rs := make([]int, ppn)
			for i := range rs {
				rs[i] = k*ppn + i
			}
			j.place.Ranks = append(j.place.Ranks, rs)
		}
		return j
	}
	small, large := jobOf(2), jobOf(30000)
	sealedSmall, err := sealSpec(key, small.nodeSpec(1))
	if err != nil {
		t.Fatal(err)
	}
	var total, most int
	const every = 97 // a sample of the nodes
	for k := 0; k < 30000; k += every {
		sealed, err := sealSpec(key, large.nodeSpec(k))
		if err != nil {
			t.Fatal(err)
		}
		total += len(sealed) * every
		most = max(most, len(sealed))
		if k == 1 {
			back, err := openSpec(key, "j1", 1, sealed)
			if err != nil || back.Nodes != 30000 || back.At.Host != "node00001" || len(back.At.Ranks) != ppn || back.At.Ranks[0] != ppn {
				t.Fatalf("node 1's spec: %+v, %v", back, err)
			}
		}
	}
	t.Logf("a node's sealed spec: %d bytes of a 2-node job, at most %d of a 30000-node one; about %d MB sent in all", len(sealedSmall), most, total>>20)
	// Only the ranks' numbers (up to 7 digits, not 3) and the node count
	// are longer.
	if most > len(sealedSmall)+ppn*5+16 || most > 2048 {
		t.Errorf("a node's spec grows with the job: %d bytes of a 30000-node job, %d of a 2-node one", most, len(sealedSmall))
	}
	if total > 100<<20 {
		t.Errorf("the launcher sends %d MB of specs to start 30000 nodes", total>>20)
	}
}

// TestSpecForAnotherNode: a spec sealed for node 1 is refused by node 2's
// agent, though sealed with the job's key.
func TestSpecForAnotherNode(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	sealed, err := sealSpec(key, agentSpec{JobID: "j1", Program: "prog", Node: 1, Nodes: 3, At: nodeAt{Ranks: []int{1}}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// A launcher, or someone who saw node 1's spec go by, that sends node
	// 1's spec to every agent.
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				cc := newCtrlConn(c)
				if cc.send(message{T: msgChallenge, Nonce: make([]byte, 32)}) != nil {
					return
				}
				if m, err := cc.recv(); err != nil || m.T != msgHello {
					return
				}
				cc.sendSpec(sealed)
				cc.recv() // until the agent hangs up
			}()
		}
	}()
	dial := func(node int) error {
		a := &agent{boot: agentBoot{JobID: "j1", Key: key, Control: ln.Addr().String()}, node: node, log: slog.New(slog.DiscardHandler)}
		err := a.dial(context.Background())
		if err == nil {
			a.conn.close()
		}
		return err
	}
	if err := dial(1); err != nil {
		t.Fatalf("node 1's agent refused its spec: %v", err)
	}
	if err := dial(2); err == nil || !strings.Contains(err.Error(), "node 2") {
		t.Errorf("node 2's agent took node 1's spec: %v", err)
	}
}

// TestConnectedAtHello: a node whose agent has proved itself counts as
// connected for --agent-timeout, before its spec has reached it.
func TestConnectedAtHello(t *testing.T) {
	j, control := loopJob(t, 2, 1, io.Discard)
	c, err := net.Dial("tcp", control)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cc := newAgentConn(c)
	m, err := cc.recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := cc.send(message{T: msgHello, Node: 0, MAC: helloMAC(j.key, j.id, 0, m.Nonce)}); err != nil {
		t.Fatal(err)
	}
	// The agent reads no spec.
	for deadline := time.Now().Add(time.Minute); !j.hello[0].Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("node 0 not connected after its hello")
		}
	}
	j.procs = []*launched{{what: "srun", nodes: []int{0, 1}, exited: true, out: &procLog{}}}
	j.agentsLate()
	if len(j.failures) != 1 || j.failures[0].Node != 1 || !strings.Contains(j.failures[0].Detail, "did not connect") {
		t.Errorf("failures %+v; want node 1's rank, not connected", j.failures)
	}
}

// TestBroadcastDoesNotWait: an agent that does not read its commands (its
// host stopped) does not hold up the launcher's loop, nor the commands to
// the other agents. The loop sent to each in turn, and waited up to
// ctrlWriteTimeout (a minute) for every such agent.
func TestBroadcastDoesNotWait(t *testing.T) {
	stuck, stuckPeer := net.Pipe() // a pipe has no buffer: a send waits for a read
	defer stuckPeer.Close()
	good, goodPeer := net.Pipe()
	defer goodPeer.Close()
	j := &job{log: slog.New(slog.DiscardHandler), conns: []*ctrlConn{newCtrlConn(stuck), newCtrlConn(good)}}
	defer j.conns[0].close()
	defer j.conns[1].close()
	done := make(chan struct{})
	go func() {
		j.broadcast(message{T: msgTerm})
		j.broadcast(message{T: msgKill})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("broadcast waits for an agent that does not read")
	}
	peer := newCtrlConn(goodPeer)
	for _, want := range []string{msgTerm, msgKill} {
		m, err := peer.recv()
		if err != nil || m.T != want {
			t.Fatalf("the agent that reads got %+v, %v; want %s", m, err, want)
		}
	}
}

// TestEnvFlagNotSet: -x VAR for a VAR that xrcrun's environment does not
// have passes nothing, and says so, as mpirun does ("Warning: could not
// find environment variable"); a misspelt name went unnoticed.
func TestEnvFlagNotSet(t *testing.T) {
	t.Parallel()
	_, rank := tools(t)
	j := startJob(t, ".", nil, "-n", "1", "-x", "XRC_TEST_NOT_SET", "-x", "XRC_TEST_SET=1", rank)
	if st := j.wait(time.Minute); st != 0 {
		t.Fatalf("exit status %d\n%s", st, j.stderr.String())
	}
	if s := j.stderr.String(); !strings.Contains(s, "-x XRC_TEST_NOT_SET: not set") || strings.Contains(s, "XRC_TEST_SET") {
		t.Errorf("stderr %q: want a warning about -x XRC_TEST_NOT_SET only", s)
	}
}
