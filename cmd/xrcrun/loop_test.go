package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The tests here run the launcher's loop in the test process, with agents
// that are goroutines of the test speaking the control protocol over TCP
// (the agent's own relay sends the ranks' output), and a stdout that the
// test can hold still.

// heldWriter is a stdout that nobody reads until release.
type heldWriter struct {
	held    chan struct{} // closed by release
	release func()
	mu      sync.Mutex
	b       bytes.Buffer
}

func newHeldWriter() *heldWriter {
	w := &heldWriter{held: make(chan struct{})}
	w.release = sync.OnceFunc(func() { close(w.held) })
	return w
}

func (w *heldWriter) Write(p []byte) (int, error) {
	<-w.held
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// loopJob makes a job of nodes nodes with ppn ranks each, serving its
// control socket, with stdout as the launcher's stdout.
func loopJob(t *testing.T, nodes, ppn int, stdout io.Writer) (*job, string) {
	t.Helper()
	key := []byte("0123456789abcdef0123456789abcdef")
	j := &job{id: "j1", key: key, cfg: &launchConfig{grace: 100 * time.Millisecond}, log: slog.New(slog.DiscardHandler),
		stdout: stdout, stderr: io.Discard}
	for k := range nodes {
		j.place.Nodes = append(j.place.Nodes, node{})
		var rs []int
		for range ppn {
			rs = append(rs, len(j.place.Node))
			j.place.Node = append(j.place.Node, k)
		}
		j.place.Ranks = append(j.place.Ranks, rs)
	}
	rdv, err := listenRendezvous(context.Background(), "127.0.0.1:0", len(j.place.Node), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	j.rdv = rdv
	j.events = make(chan event, 256)
	j.quit = make(chan struct{})
	j.hello = make([]atomic.Bool, nodes)
	j.conns = make([]*ctrlConn, nodes)
	j.trackRanks(len(j.place.Node))
	j.out = newOutput(stdout, io.Discard, false, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go j.accept(ln)
	t.Cleanup(func() {
		close(j.quit)
		ln.Close()
		rdv.Close()
		for _, c := range j.conns {
			if c != nil {
				c.close()
			}
		}
	})
	return j, ln.Addr().String()
}

// fakeRank writes lines "rank R line N ...\n" until it wrote lines of
// them (-1: until stopped), then ends its output.
type fakeRank struct {
	rank, lines, n int
	stop           atomic.Bool
	pending        []byte
}

func (f *fakeRank) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(f.pending) == 0 {
			if f.stop.Load() || f.lines >= 0 && f.n >= f.lines {
				break
			}
			f.pending = fmt.Appendf(nil, "rank %d line %d %s\n", f.rank, f.n, bytes.Repeat([]byte{'a' + byte(f.n%26)}, f.n%150))
			f.n++
		}
		c := copy(p[n:], f.pending)
		f.pending = f.pending[c:]
		n += c
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// runFakeAgent connects as node's agent and runs its ranks, each writing
// lines lines, as agent.run does: their output through agent.relay, then
// their exits; a term stops them, and they exit as terminated.
func runFakeAgent(t *testing.T, j *job, control string, node, lines int) {
	c, err := net.Dial("tcp", control)
	if err != nil {
		t.Error(err)
		return
	}
	a := &agent{node: node, log: slog.New(slog.DiscardHandler), conn: newAgentConn(c)}
	defer a.conn.close()
	m, err := a.conn.recv()
	if err != nil {
		t.Error(err)
		return
	}
	if err := a.conn.send(message{T: msgHello, Node: node, MAC: helloMAC(j.key, j.id, node, m.Nonce)}); err != nil {
		t.Error(err)
		return
	}
	if _, err := a.conn.recvSpec(); err != nil {
		t.Error(err)
		return
	}
	a.conn.send(message{T: msgReady})
	var ranks []*fakeRank
	for _, r := range j.place.Ranks[node] {
		ranks = append(ranks, &fakeRank{rank: r, lines: lines})
	}
	var terminated atomic.Bool
	bye := make(chan struct{})
	go func() {
		defer close(bye)
		for {
			m, err := a.conn.recv()
			if err != nil || m.T == msgBye {
				for _, f := range ranks { // the launcher is gone, or should be
					f.stop.Store(true)
				}
				return
			}
			if m.T == msgTerm {
				terminated.Store(true)
				for _, f := range ranks {
					f.stop.Store(true)
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for _, f := range ranks {
		wg.Go(func() {
			a.conn.send(message{T: msgStarted, Rank: f.rank})
			var sending atomic.Int32
			a.relay(f.rank, 1, f, &sending)
			m := message{T: msgExit, Rank: f.rank}
			if terminated.Load() {
				m.Code, m.Signal, m.Terminated = -1, int(termSignal), true
			}
			a.conn.send(m)
		})
	}
	wg.Wait()
	<-bye
}

// startLoop runs j's loop; wait waits until it ends, or fails the test
// after limit.
func startLoop(t *testing.T, ctx context.Context, j *job) (wait func(limit time.Duration)) {
	done := make(chan struct{})
	go func() { j.loop(ctx); close(done) }()
	return func(limit time.Duration) {
		t.Helper()
		select {
		case <-done:
		case <-time.After(limit):
			t.Fatalf("the job did not end within %v", limit)
		}
	}
}

// TestOutputHeld: while nobody reads the launcher's stdout, for longer
// than a control connection's write timeout, the ranks are held back and
// the job goes on; once stdout is read, every line comes out whole and in
// order, and the job succeeds.
func TestOutputHeld(t *testing.T) {
	defer func(d time.Duration) { ctrlWriteTimeout = d }(ctrlWriteTimeout)
	ctrlWriteTimeout = 200 * time.Millisecond
	const nodes, ppn, lines = 2, 2, 40000 // 16 MB of output
	stdout := newHeldWriter()
	defer stdout.release()
	j, control := loopJob(t, nodes, ppn, stdout)
	var agents sync.WaitGroup
	for k := range nodes {
		agents.Go(func() { runFakeAgent(t, j, control, k, lines) })
	}
	wait := startLoop(t, context.Background(), j)
	for deadline := time.Now().Add(time.Minute); !j.out.full(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the ranks' output does not fill the launcher's queue")
		}
	}
	time.Sleep(10 * ctrlWriteTimeout) // held back, for longer than a write may take
	stdout.release()
	wait(5 * time.Minute)
	j.out.close(context.Background(), 0)
	agents.Wait()
	if len(j.failures) > 0 || j.cause != nil {
		t.Errorf("the job failed: %v %v", failureReport(j.failures), j.cause)
	}
	next := make([]int, nodes*ppn)
	sc := bufio.NewScanner(&stdout.b)
	for sc.Scan() {
		var r, n int
		if _, err := fmt.Sscanf(sc.Text(), "rank %d line %d", &r, &n); err != nil || r < 0 || r >= len(next) ||
			sc.Text() != fmt.Sprintf("rank %d line %d %s", r, n, bytes.Repeat([]byte{'a' + byte(n%26)}, n%150)) {
			t.Fatalf("line %q mixed up", sc.Text())
		}
		if n != next[r] {
			t.Fatalf("rank %d: line %d after line %d", r, n, next[r]-1)
		}
		next[r]++
	}
	for r, n := range next {
		if n != lines {
			t.Errorf("rank %d: %d lines of %d", r, n, lines)
		}
	}
}

// TestInterruptWhileOutputHeld: a signal ends the job while its stdout is
// held for good; the output is dropped after the grace period, and the
// launcher does not hang.
func TestInterruptWhileOutputHeld(t *testing.T) {
	stdout := newHeldWriter()
	defer stdout.release()
	j, control := loopJob(t, 2, 2, stdout)
	var agents sync.WaitGroup
	for k := range 2 {
		agents.Go(func() { runFakeAgent(t, j, control, k, -1) })
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	wait := startLoop(t, ctx, j)
	for deadline := time.Now().Add(time.Minute); !j.out.full(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the ranks' output does not fill the launcher's queue")
		}
	}
	cancel(signalCause{os.Interrupt})
	wait(time.Minute)
	j.out.close(ctx, j.cfg.grace)
	agents.Wait()
	if _, ok := j.cause.(signalCause); !ok || len(j.failures) > 0 {
		t.Errorf("cause %v, failures %v", j.cause, failureReport(j.failures))
	}
}

// TestLogWhileOutputHeld: while nobody reads the launcher's stderr, the
// launcher's log (its loop logs a lost node, a refused agent) waits in the
// output's queue and does not hold up the caller; it comes out in order
// once stderr is read again.
func TestLogWhileOutputHeld(t *testing.T) {
	stderr := newHeldWriter()
	o := newOutput(io.Discard, stderr, false, nil)
	lw := &logWriter{w: queueWriter{o, 2}}
	log := slog.New(slog.NewTextHandler(lw, nil))
	done := make(chan struct{})
	go func() {
		for i := range 100 {
			log.Warn("line", "i", i)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("logging waits for a stderr nobody reads")
	}
	stderr.release()
	o.close(context.Background(), 0)
	stderr.mu.Lock()
	n := bytes.Count(stderr.b.Bytes(), []byte("msg=line"))
	stderr.mu.Unlock()
	if n != 100 {
		t.Fatalf("%d log lines written, want 100", n)
	}
}
