package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"testing"
	"time"
)

// fuzzCtrl is a control connection whose peer sends the fuzzer's bytes
// and ignores what it is sent.
type fuzzCtrl struct{ io.Reader }

func (fuzzCtrl) Write(p []byte) (int, error)      { return len(p), nil }
func (fuzzCtrl) Close() error                     { return nil }
func (fuzzCtrl) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (fuzzCtrl) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (fuzzCtrl) SetDeadline(time.Time) error      { return nil }
func (fuzzCtrl) SetReadDeadline(time.Time) error  { return nil }
func (fuzzCtrl) SetWriteDeadline(time.Time) error { return nil }

// ctrlBytes is what the launcher sends an agent: the lines of msgs.
func ctrlBytes(tb testing.TB, msgs ...message) []byte {
	var b []byte
	for _, m := range msgs {
		j, err := json.Marshal(m)
		if err != nil {
			tb.Fatal(err)
		}
		b = append(append(b, j...), '\n')
	}
	return b
}

// FuzzControl feeds the fuzzer's bytes to an agent as its launcher's side
// of the control connection: the sealed spec in pieces, then commands.
// The agent must not panic; the spec it takes is at most maxSpec bytes
// and opens only if it was sealed with the job's key for the agent's node;
// every message it reads encodes to JSON that reads back the same.
func FuzzControl(f *testing.F) {
	key := []byte("0123456789abcdef0123456789abcdef")
	spec := agentSpec{JobID: "j1", Program: "prog", Node: 0, Nodes: 2, Size: 2, At: nodeAt{Ranks: []int{0}}}
	sealed, err := sealSpec(key, spec)
	if err != nil {
		f.Fatal(err)
	}
	other := spec
	other.Node = 1
	sealedOther, err := sealSpec(key, other)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ctrlBytes(f, message{T: msgSpec, Data: sealed, Last: true}, message{T: msgSignal, Signal: 10},
		message{T: msgTerm}, message{T: msgBye}))
	f.Add(ctrlBytes(f, message{T: msgSpec, Data: sealed[:10]}, message{T: msgSpec, Data: sealed[10:], Last: true}, message{T: msgKill}))
	f.Add(ctrlBytes(f, message{T: msgSpec, Data: sealedOther, Last: true}))
	f.Add(ctrlBytes(f, message{T: msgSpec}, message{T: msgBye}))
	f.Add(ctrlBytes(f, message{T: msgBye}))
	f.Add([]byte("{\"t\":\"spec\",\"data\":\"AAAA\",\"last\":true}\n{\"t\":\"out\",\"rank\":-1,\"stream\":3,\"data\":null}\n"))
	f.Add([]byte("{\"t\":\"spec\",\"last\":true}\n{\"t\":1}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c := newAgentConn(fuzzCtrl{bytes.NewReader(b)})
		got, err := c.recvSpec()
		if err != nil {
			return
		}
		if len(got) > maxSpec {
			t.Fatalf("took a spec of %d bytes", len(got))
		}
		if s, err := openSpec(key, "j1", 0, got); err == nil {
			if s.JobID != "j1" || s.Node != 0 || s.Nodes <= 0 || string(s.Key) != string(key) {
				t.Fatalf("opened a spec %+v", s)
			}
		}
		for {
			m, err := c.recv()
			if err != nil {
				return
			}
			j, err := json.Marshal(m)
			if err != nil {
				t.Fatalf("%+v: %v", m, err)
			}
			var back message
			if err := json.Unmarshal(j, &back); err != nil {
				t.Fatalf("%s: %v", j, err)
			}
			if j2, _ := json.Marshal(back); !bytes.Equal(j, j2) {
				t.Fatalf("%+v encodes as %s, which reads back as %s", m, j, j2)
			}
		}
	})
}
