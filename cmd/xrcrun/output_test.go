package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestOutputLines(t *testing.T) {
	var out, errb bytes.Buffer
	o := newOutput(&out, &errb, true, nil)
	o.write(1, 1, []byte("hel"))
	o.write(2, 1, []byte("two\nthr"))
	o.write(1, 1, []byte("lo\nwor"))
	o.write(1, 2, []byte("oops\n"))
	o.write(2, 1, []byte("ee\n"))
	settle(t, o)
	if out.String() != "[2] two\n[1] hello\n[2] three\n" {
		t.Errorf("stdout %q", out.String())
	}
	o.flush(1)
	settle(t, o)
	if !strings.HasSuffix(out.String(), "[1] wor\n") || errb.String() != "[1] oops\n" {
		t.Errorf("after flush: stdout %q stderr %q", out.String(), errb.String())
	}
	o.write(3, 1, bytes.Repeat([]byte("y"), maxLineLen)) // tagged, a piece of a long line is ended
	o.close(context.Background(), 0)
	if want := "[3] " + strings.Repeat("y", maxLineLen) + "\n"; !strings.HasSuffix(out.String(), want) {
		t.Errorf("tagged long line: %d bytes", out.Len())
	}

	out.Reset()
	o = newOutput(&out, &errb, false, nil)
	o.write(3, 1, bytes.Repeat([]byte("x"), maxLineLen))
	settle(t, o)
	if out.Len() != maxLineLen {
		t.Errorf("a line without end held back: %d bytes written", out.Len())
	}
	out.Reset()
	o.write(0, 1, []byte("a\nb\nc"))
	settle(t, o)
	if out.String() != "a\nb\n" {
		t.Errorf("untagged: %q", out.String())
	}
	o.flush(0)
	o.close(context.Background(), 0)
	if out.String() != "a\nb\nc" {
		t.Errorf("untagged after flush: %q", out.String())
	}

	// The status line is cleared before output, in order with it.
	out.Reset()
	errb.Reset()
	st := &statusLine{w: &errb, on: true}
	o = newOutput(&out, &errb, false, st)
	o.updateStatus("j", 0, 1, 0, 0, 1)
	o.write(0, 2, []byte("x\n"))
	o.updateStatus("j", 1, 1, 0, 0, 1)
	o.updateStatus("j", 1, 1, 1, 0, 1)
	o.stopStatus()
	o.updateStatus("j", 1, 1, 1, 0, 1)
	o.close(context.Background(), 0)
	if want := "\r\033[Kxrcrun j: nodes 0/1 ready, ranks 0/1 started, 0/1 connected\r\033[Kx\n" +
		"\r\033[Kxrcrun j: nodes 1/1 ready, ranks 1/1 started, 0/1 connected\r\033[K"; errb.String() != want {
		t.Errorf("stderr %q, want %q", errb.String(), want)
	}
}

// TestOutputUntaggedBytes: without --tag-output the ranks' bytes pass
// unchanged, whatever they are: no newline is added to a line longer than
// maxLineLen, nor to a rank's last line.
func TestOutputUntaggedBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var data [2][]byte // of ranks 0 and 1
	for r := range data {
		for range 40 {
			switch rng.IntN(3) {
			case 0: // binary
				b := make([]byte, rng.IntN(3*maxLineLen))
				for i := range b {
					b[i] = byte(rng.Uint32())
				}
				data[r] = append(data[r], b...)
			case 1: // a long line
				data[r] = append(data[r], bytes.Repeat([]byte{'a' + byte(r)}, maxLineLen+rng.IntN(maxLineLen))...)
			default:
				data[r] = append(data[r], "a line\n"...)
			}
		}
		data[r] = append(data[r], "no end"...)
	}
	for _, ranks := range [][]int{{0}, {0, 1}} {
		var out, errb bytes.Buffer
		o := newOutput(&out, &errb, false, nil)
		var off [2]int
		for more := true; more; {
			more = false
			for _, r := range ranks {
				n := min(len(data[r])-off[r], 1+rng.IntN(outChunk))
				o.write(r, 1, data[r][off[r]:off[r]+n])
				off[r] += n
				more = more || off[r] < len(data[r])
			}
		}
		for _, r := range ranks {
			o.flush(r)
		}
		o.close(context.Background(), 0)
		if len(ranks) == 1 {
			if !bytes.Equal(out.Bytes(), data[0]) {
				t.Errorf("one rank: %d bytes out of %d in, not the same", out.Len(), len(data[0]))
			}
			continue
		}
		if out.Len() != len(data[0])+len(data[1]) {
			t.Errorf("two ranks: %d bytes out of %d in", out.Len(), len(data[0])+len(data[1]))
		}
	}
}

// settle waits until o has written what it was given.
func settle(t *testing.T, o *output) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		o.mu.Lock()
		idle := len(o.queue) == 0 && !o.busy
		o.mu.Unlock()
		if idle {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("output not written within a minute")
		}
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
	j.hello = make([]atomic.Bool, 1)
	j.conns = make([]*ctrlConn, 1)
	j.trackRanks(1)
	j.out = newOutput(&stdout, &stderr, false, newStatusLine(&stderr))
	j.handle(event{kind: evMessage, node: 0, msg: message{T: msgOut, Rank: 0, Stream: 1, Data: []byte("last words")}})
	j.handle(event{kind: evGone, node: 0, err: errors.New("EOF")})
	if j.done != 1 {
		t.Fatalf("the lost node's rank did not end: %d ended", j.done)
	}
	j.out.close(context.Background(), 0)
	if stdout.String() != "last words" {
		t.Fatalf("stdout %q, want the lost rank's last line", stdout.String())
	}
}
