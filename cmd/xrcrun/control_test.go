package main

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// TestControlHandshake: the launcher takes an agent that proves it holds
// the job's key for a node of the job, and nothing else.
func TestControlHandshake(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	j := &job{id: "j1", key: key, place: placement{Nodes: make([]node, 2)}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
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
		closed := make(chan struct{}) // the launcher hung up: refused
		go func() { cc.recv(); close(closed) }()
		select {
		case ev := <-j.events:
			if ev.kind != evConnected || ev.node != node {
				t.Errorf("event %+v", ev)
			}
			ev.conn.close()
			return true
		case <-closed:
			return false
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
