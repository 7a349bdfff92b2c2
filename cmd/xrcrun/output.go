package main

import (
	"bytes"
	"context"
	"io"
	"strconv"
	"sync"
	"time"
)

// maxLineLen bounds what the launcher holds of a rank's unfinished line.
const maxLineLen = 64 << 10

// maxQueued bounds the output waiting for the launcher's stdout and stderr
// before the launcher stops reading its agents' control connections (see
// output.room).
const maxQueued = 4 << 20

// output writes the ranks' output to the launcher's stdout and stderr a
// whole line at a time, so that lines of different ranks never mix, each
// prefixed with "[rank] " under --tag-output. Without it the bytes pass
// unchanged: a line longer than maxLineLen may come out in pieces, and a
// rank's last line without a newline comes out without one.
//
// The job's loop hands it output (write, flush) and status line changes,
// and never waits for them: one goroutine of output's own writes them, in
// the order they came, so that a reader of stdout that stops (a pager, a
// slow pipe) never stops the loop from serving its agents, signals and
// timeout. While more than maxQueued bytes wait, the readers of the
// control connections wait (room) before reading on, and TCP pushes back
// to the agents and so to the ranks' pipes.
type output struct {
	tag     bool
	partial map[[2]int][]byte // the loop's: unfinished lines by rank and stream

	w      [3]io.Writer // the writer's: [1] stdout, [2] stderr
	status *statusLine  // the writer's

	mu       sync.Mutex
	queue    []outItem     // guarded by mu
	queued   int           // bytes in queue or being written; guarded by mu
	busy     bool          // the writer works on items taken from queue; guarded by mu
	roomC    chan struct{} // closed when queued falls to maxQueued; guarded by mu
	closed   bool          // no more items come; guarded by mu
	dropping bool          // output is thrown away; guarded by mu
	wake     chan struct{} // tells the writer there is work
	dropped  chan struct{} // closed by drop
	done     chan struct{} // closed when the writer has written everything after close
}

// outItem is output for a stream, or (op) a change of the status line.
type outItem struct {
	stream int
	data   []byte
	op     func(*statusLine)
	redraw bool // op only redraws the status line
}

// newOutput starts the writer of the ranks' output to stdout and stderr;
// status, if not nil, is the status line on stderr, which the writer owns
// from now on.
func newOutput(stdout, stderr io.Writer, tag bool, status *statusLine) *output {
	o := &output{
		tag: tag, partial: map[[2]int][]byte{}, w: [3]io.Writer{nil, stdout, stderr}, status: status,
		wake: make(chan struct{}, 1), dropped: make(chan struct{}), done: make(chan struct{}),
	}
	go o.writer()
	return o
}

// write takes a piece of what rank wrote on stream (1 or 2) and queues
// the lines it completes. It is for the loop's goroutine, and does not
// wait.
func (o *output) write(rank, stream int, data []byte) {
	if stream != 1 && stream != 2 {
		stream = 2
	}
	k := [2]int{rank, stream}
	buf := append(o.partial[k], data...)
	end := bytes.LastIndexByte(buf, '\n')
	if end < 0 && len(buf) >= maxLineLen { // a line without end: pass it on in pieces
		o.emit(rank, stream, buf)
		delete(o.partial, k)
		return
	}
	if end < 0 {
		o.partial[k] = buf
		return
	}
	o.emit(rank, stream, buf[:end+1])
	if rest := buf[end+1:]; len(rest) > 0 {
		o.partial[k] = append([]byte(nil), rest...)
	} else {
		delete(o.partial, k)
	}
}

// flush queues what rank left without a final newline; tagged, the line
// is ended.
func (o *output) flush(rank int) {
	for stream := 1; stream <= 2; stream++ {
		k := [2]int{rank, stream}
		if b := o.partial[k]; len(b) > 0 {
			o.emit(rank, stream, b)
		}
		delete(o.partial, k)
	}
}

// emit queues lines of rank: whole lines, except for a piece of a line
// longer than maxLineLen or the rank's last one, which tagged output ends
// with a newline.
func (o *output) emit(rank, stream int, lines []byte) {
	if !o.tag {
		o.put(outItem{stream: stream, data: lines})
		return
	}
	prefix := []byte("[" + strconv.Itoa(rank) + "] ")
	var b bytes.Buffer
	for len(lines) > 0 {
		b.Write(prefix)
		i := bytes.IndexByte(lines, '\n')
		if i < 0 {
			b.Write(lines)
			b.WriteByte('\n')
			break
		}
		b.Write(lines[:i+1])
		lines = lines[i+1:]
	}
	o.put(outItem{stream: stream, data: b.Bytes()})
}

// updateStatus and stopStatus change the status line (statusLine.update,
// statusLine.stop) in order with the output. A redraw waiting behind
// output is replaced by a newer one.
func (o *output) updateStatus(id string, ready, nodes, started, joined, size int) {
	o.put(outItem{op: func(s *statusLine) { s.update(id, ready, nodes, started, joined, size) }, redraw: true})
}

func (o *output) stopStatus() { o.put(outItem{op: (*statusLine).stop}) }

func (o *output) put(it outItem) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed || o.dropping {
		return
	}
	if n := len(o.queue); it.redraw && n > 0 && o.queue[n-1].redraw {
		o.queue[n-1] = it // the redraw waiting is out of date
	} else {
		o.queue = append(o.queue, it)
	}
	o.queued += len(it.data)
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// writer writes the queued items until close, or until drop.
func (o *output) writer() {
	defer close(o.done)
	for {
		o.mu.Lock()
		for len(o.queue) == 0 && !o.closed && !o.dropping {
			o.busy = false
			o.mu.Unlock()
			<-o.wake
			o.mu.Lock()
		}
		if len(o.queue) == 0 || o.dropping {
			o.busy = false
			o.mu.Unlock()
			return
		}
		items := o.queue
		o.queue, o.busy = nil, true
		o.mu.Unlock()
		for _, it := range items {
			if it.op != nil {
				if o.status != nil {
					it.op(o.status)
				}
				continue
			}
			if o.status != nil {
				o.status.clear()
			}
			o.w[it.stream].Write(it.data)
			o.mu.Lock()
			if o.dropping {
				o.mu.Unlock()
				return
			}
			o.queued -= len(it.data)
			o.makeRoom()
			o.mu.Unlock()
		}
	}
}

// makeRoom lets the readers waiting in room go on, if there is room.
// o.mu is held.
func (o *output) makeRoom() {
	if o.roomC != nil && (o.queued <= maxQueued || o.dropping) {
		close(o.roomC)
		o.roomC = nil
	}
}

// full says more than maxQueued bytes wait to be written.
func (o *output) full() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.queued > maxQueued && !o.dropping
}

// room waits while the output is full, or until quit is closed. The
// readers of the control connections call it before they read on.
func (o *output) room(quit <-chan struct{}) {
	o.mu.Lock()
	if o.queued <= maxQueued || o.dropping {
		o.mu.Unlock()
		return
	}
	if o.roomC == nil {
		o.roomC = make(chan struct{})
	}
	c := o.roomC
	o.mu.Unlock()
	select {
	case <-c:
	case <-quit:
	}
}

// drop throws away the output waiting and any to come: the job was asked
// to stop, and its output, which nobody reads, must not hold it up.
func (o *output) drop() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.dropping {
		return
	}
	o.dropping = true
	o.queue, o.queued = nil, 0
	o.makeRoom()
	close(o.dropped)
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// close waits until everything queued is written. If ctx is done (the
// user asked the job to stop), it waits at most grace more, then drops
// what is left and returns, though a write may still be under way.
func (o *output) close(ctx context.Context, grace time.Duration) {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
	select {
	case <-o.done:
		return
	case <-o.dropped:
		return
	case <-ctx.Done():
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-o.done:
	case <-o.dropped:
	case <-t.C:
		o.drop()
	}
}

// queueWriter queues what it is given for stream of o, untouched: the
// output of the processes that start agents. It does not wait.
type queueWriter struct {
	o      *output
	stream int
}

func (w queueWriter) Write(b []byte) (int, error) {
	w.o.put(outItem{stream: w.stream, data: bytes.Clone(b)})
	return len(b), nil
}
