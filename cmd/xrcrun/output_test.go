package main

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestOutputLines(t *testing.T) {
	var out, errb bytes.Buffer
	cleared := 0
	o := newOutput(&out, &errb, true, func() { cleared++ })
	o.write(1, 1, []byte("hel"))
	o.write(2, 1, []byte("two\nthr"))
	o.write(1, 1, []byte("lo\nwor"))
	o.write(1, 2, []byte("oops\n"))
	o.write(2, 1, []byte("ee\n"))
	if out.String() != "[2] two\n[1] hello\n[2] three\n" {
		t.Errorf("stdout %q", out.String())
	}
	o.flush(1)
	if !strings.HasSuffix(out.String(), "[1] wor\n") || errb.String() != "[1] oops\n" {
		t.Errorf("after flush: stdout %q stderr %q", out.String(), errb.String())
	}
	if cleared != 5 {
		t.Errorf("status line cleared %d times, want 5 (once per write)", cleared)
	}
	out.Reset()
	o = newOutput(&out, &errb, false, nil)
	o.write(3, 1, bytes.Repeat([]byte("x"), maxLineLen))
	if out.Len() != maxLineLen+1 {
		t.Errorf("a line without end held back: %d bytes written", out.Len())
	}
	out.Reset()
	o.write(0, 1, []byte("a\nb\nc"))
	o.flush(0)
	if out.String() != "a\nb\nc\n" {
		t.Errorf("untagged: %q", out.String())
	}
}

func TestStatusLine(t *testing.T) {
	var b bytes.Buffer
	s := newStatusLine(&b) // not a terminal: nothing
	s.update("j", 1, 2, 3, 0, 4)
	if b.Len() != 0 {
		t.Fatalf("status line drawn on a non-terminal: %q", b.String())
	}
	s.on = true // as on a terminal
	s.update("j", 1, 2, 3, 1, 4)
	s.update("j", 1, 2, 3, 1, 4) // unchanged: not redrawn
	if want := "\r\033[Kxrcrun j: nodes 1/2 ready, ranks 3/4 started, 1/4 connected"; b.String() != want {
		t.Errorf("drew %q, want %q", b.String(), want)
	}
	b.Reset()
	s.clear()
	s.clear()
	if b.String() != "\r\033[K" {
		t.Errorf("clear wrote %q", b.String())
	}
	b.Reset()
	s.update("j", 2, 2, 4, 4, 4) // everyone connected: gone for good
	s.update("j", 2, 2, 4, 3, 4)
	if b.Len() != 0 {
		t.Errorf("drawn after every rank joined: %q", b.String())
	}
}

// TestLostNodeFlushesOutput: a rank's last line without its newline is
// held until the rank ends. When the rank's node is lost, the rank ends
// without an exit message, and that line must come out all the same.
func TestLostNodeFlushesOutput(t *testing.T) {
	var stdout, stderr bytes.Buffer
	j := &job{cfg: &launchConfig{grace: time.Second}, log: slog.New(slog.DiscardHandler), stdout: &stdout, stderr: &stderr}
	j.place = placement{Nodes: []node{{}}, Ranks: [][]int{{0}}, Node: []int{0}}
	j.conns = make([]*ctrlConn, 1)
	j.rankDone = make([]bool, 1)
	j.status = newStatusLine(&stderr)
	j.out = newOutput(&stdout, &stderr, false, j.status.clear)
	j.handle(event{kind: evMessage, node: 0, msg: message{T: msgOut, Rank: 0, Stream: 1, Data: []byte("last words")}})
	j.handle(event{kind: evGone, node: 0, err: errors.New("EOF")})
	if j.done != 1 {
		t.Fatalf("the lost node's rank did not end: %d ended", j.done)
	}
	if stdout.String() != "last words\n" {
		t.Fatalf("stdout %q, want the lost rank's last line", stdout.String())
	}
}
