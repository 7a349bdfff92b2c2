package main

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"
)

// TestControlHandshake: the launcher takes an agent that proves it holds
// the job's key for a node of the job, and nothing else; the one it takes
// gets the spec.
func TestControlHandshake(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	sealed, err := sealSpec(key, agentSpec{JobID: "j1", Program: "prog", Nodes: make([]nodeAt, 2)})
	if err != nil {
		t.Fatal(err)
	}
	j := &job{id: "j1", key: key, sealed: sealed, place: placement{Nodes: make([]node, 2)}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
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
		if spec, err := openSpec(key, "j1", b); err != nil || spec.Program != "prog" || string(spec.Key) != string(key) {
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
		"wrong key":     {0, func(n []byte) []byte { return helloMAC([]byte("another key, as long as the other"), "j1", 0, n) }},
		"wrong job":     {0, func(n []byte) []byte { return helloMAC(key, "j2", 0, n) }},
		"another node":  {0, good(1)},
		"no such node":  {2, good(2)},
		"stale nonce":   {0, func([]byte) []byte { return helloMAC(key, "j1", 0, make([]byte, 32)) }},
		"no proof":      {0, func([]byte) []byte { return nil }},
		"negative node": {-1, good(-1)},
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
	got := e.resolve(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
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
// one sealed under another key, or of another job, or too large, is
// refused.
func TestSpecTransfer(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	spec := agentSpec{JobID: "j1", Program: "prog", Nodes: make([]nodeAt, 80000)}
	for k := range spec.Nodes {
		spec.Nodes[k] = nodeAt{Host: fmt.Sprintf("node%06d", k), Ranks: []int{2 * k, 2*k + 1}}
	}
	sealed, err := sealSpec(key, spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(sealed) < 3*maxLine {
		t.Fatalf("the spec is %d bytes: too small for the test", len(sealed))
	}
	transfer := func(send func(*ctrlConn) error) ([]byte, error) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		go func() { send(newCtrlConn(a)); a.Close() }()
		return newAgentConn(b).recvSpec()
	}
	got, err := transfer(func(c *ctrlConn) error { return c.sendSpec(sealed) })
	if err != nil {
		t.Fatal(err)
	}
	back, err := openSpec(key, "j1", got)
	if err != nil || len(back.Nodes) != len(spec.Nodes) || back.Nodes[79999].Host != "node079999" || back.Nodes[7].Ranks[1] != 15 {
		t.Fatalf("spec back: %v", err)
	}
	if _, err := openSpec([]byte("another key, as long as the other"), "j1", got); err == nil {
		t.Error("opened under another key")
	}
	if _, err := openSpec(key, "j2", got); err == nil {
		t.Error("opened as another job's")
	}
	got[len(got)/2] ^= 1
	if _, err := openSpec(key, "j1", got); err == nil {
		t.Error("opened a spec changed on the way")
	}
	// A peer that sends more than maxSpec is cut off at maxSpec; the
	// launcher does not seal more.
	defer func(n int) { maxSpec = n }(maxSpec)
	maxSpec = 4 << 20
	chunk := make([]byte, specChunk)
	_, err = transfer(func(c *ctrlConn) error {
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
