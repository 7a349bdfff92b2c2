package verbsx

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	xunix "github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/transport/internal/transporttest"
	"github.com/xrcrun/xrc/verbs"
)

// testMagic marks the Remotes of the tests' Endpoints.
const testMagic = 'T'

// end is an Endpoint of a test, with what Progress delivers to it.
type end = transporttest.End[*Endpoint]

var progress = transporttest.Progress[*Endpoint]

// config is the config of the Endpoint of rank, on the device context c,
// toward peers (by rank, nil for none), with an SRQ of srqDepth buffers.
func config(c *verbs.Context, rank int, peers []*Peer, srqDepth int, kick func()) EndpointConfig {
	m := NewMetrics("vx", rank)
	nodes := make([]int, max(len(peers), rank+1)) // a node each
	for i := range nodes {
		nodes[i] = i
	}
	return EndpointConfig{
		CoreConfig: CoreConfig{Device: c, Port: 1,
			Sizes: Sizes{EagerSize: 256, SRQDepth: srqDepth, SendSlots: 16, SendDepth: 16},
			CQE:   srqDepth + len(peers)*16 + 16,
			NewSRQ: func(pd *verbs.PD, _ *verbs.CQ) (*verbs.SRQ, error) {
				return pd.CreateSRQ(verbs.SRQAttr{MaxWR: uint32(srqDepth), MaxSGE: 1})
			}},
		Name: "vx", Magic: testMagic, Rank: rank, Peers: peers, Nodes: nodes, Kick: kick,
		Log: slog.New(slog.DiscardHandler), Metrics: m, QPs: m.Gauge("qps", "QPs."), RecvQPKey: "qpn"}
}

// newEnd makes the Endpoint of config and runs it; it is closed when
// the test ends. The peers' Conns are the test's to make and connect.
func newEnd(t *testing.T, c *verbs.Context, rank int, peers []*Peer, srqDepth int) *end {
	return newEndRun(t, c, rank, peers, srqDepth, true)
}

// newEndRun is newEnd, whose Endpoint runs (watches its CQ and events,
// kicking the test) only if run is set.
func newEndRun(t *testing.T, c *verbs.Context, rank int, peers []*Peer, srqDepth int, run bool) *end {
	t.Helper()
	k := transporttest.NewKicker()
	e, err := NewEndpoint(config(c, rank, peers, srqDepth, k.Kick))
	if err != nil {
		t.Fatal(errors.Join(err, e.Free()))
	}
	if run {
		e.Run()
	}
	t.Cleanup(func() {
		if err := e.Close(e.Free); err != nil {
			t.Error(err)
		}
	})
	return &end{Tr: e, H: transporttest.NewHandler(), K: k}
}

// count is the value of the counter c.
func count(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// nodePeers are the peers of rank 0 in a job of nodes 0, 1, 1, 2 (XRC's
// view): ranks 1 and 2 share the Conn toward node 1, rank 3 has node 2's.
func nodePeers() []*Peer {
	n1, n2 := NodeConn(1), NodeConn(2)
	peers := []*Peer{nil, {Rank: 1, Conn: &n1}, {Rank: 2, Conn: &n1}, {Rank: 3, Conn: &n2}}
	for _, p := range peers[1:] {
		p.Recorded, p.Acked = true, true
	}
	return peers
}

// remote is a Remote of n bytes that rank exposed, as far as the reader
// can tell.
func remote(rank, n int) []byte {
	return Remote{Rank: rank, Addr: 1 << 20, RKey: 0x1234, Len: uint64(n)}.Encode(testMagic)
}

// stub is a Connector that records whom it was asked to connect and, at
// Apply, fails the Conns in fail.
type stub struct {
	e       *Endpoint
	started map[int]bool
	fail    map[*Conn]error
}

func (s *stub) Start(p *Peer) error { s.started[p.Rank] = true; return nil }

func (s *stub) Apply() {
	for c, err := range s.fail {
		s.e.Fail(c, err)
	}
	clear(s.fail)
}

// TestNodeFails: the Conn toward a node is that of all its ranks. When
// it fails (here: its lazy connection), every rank of the node fails
// with the error, which names the node: the reads queued toward any of
// them end with it, so does every later call toward them, and Progress
// reports each failed once. The ranks of another node go on.
func TestNodeFails(t *testing.T) {
	_, c := newDevice(t, softhca.Faults{})
	peers := nodePeers()
	x := newEnd(t, c, 0, peers, 16)
	lz := &stub{e: x.Tr, started: map[int]bool{}, fail: map[*Conn]error{}}
	x.Tr.Lazy = lz

	dst := make([]byte, 3*ChunkSize/2) // two chunks
	for rank := 1; rank <= 3; rank++ {
		if err := x.Tr.Read(rank, dst, remote(rank, len(dst)), uint64(rank)); err != nil {
			t.Fatalf("read from rank %d: %v", rank, err)
		}
	}
	if ok, err := x.Tr.TrySend(2, []byte("x")); ok || err != nil {
		t.Fatalf("send before the node is connected: %v, %v; want false, nil", ok, err)
	}
	for rank := 1; rank <= 3; rank++ {
		if !lz.started[rank] {
			t.Fatalf("rank %d: not connecting", rank)
		}
	}

	boom := errors.New("boom")
	n1 := peers[1].Conn
	lz.fail[n1] = n1.Errorf("lazy connect: %w", boom)
	progress(t, []*end{x}, func() bool { return len(x.H.Reads) >= 2 })
	const want = "vx: node 1: lazy connect: boom"
	for rank := 1; rank <= 2; rank++ {
		err, ok := x.H.Reads[uint64(rank)]
		if !ok || !errors.Is(err, boom) || err.Error() != want {
			t.Errorf("read from rank %d: ended %v with %v; want %q", rank, ok, err, want)
		}
		if ok, err := x.Tr.TrySend(rank, []byte("x")); ok || err == nil || err.Error() != want {
			t.Errorf("send to rank %d: %v, %v; want %q", rank, ok, err, want)
		}
		if err := x.Tr.Read(rank, dst, remote(rank, len(dst)), 10+uint64(rank)); err == nil || err.Error() != want {
			t.Errorf("read from rank %d: %v; want %q", rank, err, want)
		}
	}
	if n := count(t, x.Tr.m.PeerErrors); n != 2 {
		t.Errorf("%v peer errors, want the 2 ranks of node 1", n)
	}
	// Progress told the handler (a transport.PeerFailureHandler) of both
	// ranks of node 1, once each, and of no other.
	for range 10 {
		if _, err := x.Tr.Progress(x.H); err != nil {
			t.Fatal(err)
		}
	}
	if len(x.H.Failed) != 2 {
		t.Errorf("failed peers reported: %v; want ranks 1 and 2", x.H.Failed)
	}
	for rank := 1; rank <= 2; rank++ {
		if errs := x.H.Failed[rank]; len(errs) != 1 || !errors.Is(errs[0], boom) {
			t.Errorf("rank %d reported failed %v; want once, with %v", rank, errs, boom)
		}
	}

	// Node 2 is still connecting: its read waits, frames wait.
	if err, ok := x.H.Reads[3]; ok {
		t.Errorf("the read from rank 3 of node 2 ended: %v", err)
	}
	if ok, err := x.Tr.TrySend(3, []byte("x")); ok || err != nil {
		t.Errorf("send to rank 3 of node 2: %v, %v; want false, nil", ok, err)
	}
	if s := peers[3].Conn.State(); s == ConnFailed {
		t.Errorf("node 2 failed: %v", peers[3].Conn.Err())
	}
}

// TestNotConnected: without lazy connection, a read toward a node whose
// Conn is not connected fails the node, and the error names the node
// (not the rank read from), as every later call toward its ranks says.
// A send toward a node not connected fails without failing it.
func TestNotConnected(t *testing.T) {
	_, c := newDevice(t, softhca.Faults{})
	peers := nodePeers()
	x := newEnd(t, c, 0, peers, 16)

	const want = "vx: node 1: not connected"
	if ok, err := x.Tr.TrySend(1, []byte("x")); ok || err == nil || err.Error() != want {
		t.Fatalf("send to rank 1: %v, %v; want %q", ok, err, want)
	}
	if s := peers[1].Conn.State(); s == ConnFailed {
		t.Fatal("a send failed node 1")
	}
	dst := make([]byte, 100)
	if err := x.Tr.Read(1, dst, remote(1, len(dst)), 1); err != nil {
		t.Fatal(err)
	}
	progress(t, []*end{x}, func() bool { _, ok := x.H.Reads[1]; return ok })
	if err := x.H.Reads[1]; err == nil || err.Error() != want {
		t.Fatalf("read from rank 1: %v; want %q", err, want)
	}
	if s := peers[1].Conn.State(); s != ConnFailed {
		t.Fatalf("node 1 is %v after a read failed it", s)
	}
	if ok, err := x.Tr.TrySend(2, []byte("x")); ok || err == nil || err.Error() != want {
		t.Errorf("send to rank 2: %v, %v; want %q", ok, err, want)
	}
	if err := x.Tr.Read(2, dst, remote(2, len(dst)), 2); err == nil || err.Error() != want {
		t.Errorf("read from rank 2: %v; want %q", err, want)
	}
	if ok, err := x.Tr.TrySend(3, []byte("x")); ok || err == nil || err.Error() != "vx: node 2: not connected" {
		t.Errorf("send to rank 3 of node 2: %v, %v", ok, err)
	}
}

// connectRC makes RC QPs for the Conns of a's peer b.rank and b's peer
// a.rank, and connects them to each other.
func connectRC(t *testing.T, a, b *end, pa, pb *Peer) {
	t.Helper()
	for _, s := range []struct {
		x *end
		p *Peer
	}{{a, pa}, {b, pb}} {
		core := s.x.Tr.Core
		err := s.x.Tr.MakeQP(s.p.Conn, verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: core.CQ, RecvCQ: core.CQ, SRQ: core.Recv.SRQ})
		if err != nil {
			t.Fatal(err)
		}
		if s.p.Conn.State() != ConnConnecting {
			t.Fatalf("a Conn is %v after MakeQP, want connecting", s.p.Conn.State())
		}
		s.x.Tr.Receives(s.p.Conn.QP.Num(), s.p)
	}
	dest := func(x *end, c *Conn) Dest {
		port := x.Tr.Core.Port
		return Dest{GID: port.GID, MTU: port.ActiveMTU, QPN: c.QP.Num(), PSN: c.PSN}
	}
	if err := a.Tr.BringUp(pa.Conn, dest(b, pb.Conn), true); err != nil {
		t.Fatal(err)
	}
	if err := b.Tr.BringUp(pb.Conn, dest(a, pa.Conn), true); err != nil {
		t.Fatal(err)
	}
}

// rcPair is ranks 0 (a) and 1 (b) on two contexts of one device, each
// with an SRQ of srqDepth buffers, connected by RC: pa is a's peer (rank
// 1), pb b's; bAcked says whether b may send to a, bRuns whether b's
// Endpoint runs (newEndRun).
func rcPair(t *testing.T, srqDepth int, bAcked, bRuns bool) (a, b *end, pa, pb *Peer) {
	d, c0 := newDevice(t, softhca.Faults{})
	c1, err := d.Open(verbs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c1.Close() })
	ca, cb := RankConn(1), RankConn(0)
	pa = &Peer{Rank: 1, Conn: &ca, Recorded: true, Acked: true}
	pb = &Peer{Rank: 0, Conn: &cb, Recorded: true, Acked: bAcked}
	a = newEnd(t, c0, 0, []*Peer{nil, pa}, srqDepth)
	b = newEndRun(t, c1, 1, []*Peer{pb, nil}, srqDepth, bRuns)
	connectRC(t, a, b, pa, pb)
	return a, b, pa, pb
}

// TestCreditsWaitForReady: a rank gets frames from a peer it may not
// send to yet (XRC: the peer has not replied to its request). The
// credits it owes the peer for them are kept until it may, then returned
// in a credit message, and the peer, out of credits until then, sends
// again.
func TestCreditsWaitForReady(t *testing.T) {
	a, b, pa, pb := rcPair(t, 8, false, true) // b may not send to a
	ends := []*end{a, b}

	credits := a.Tr.Credits()
	if credits < 2 || b.Tr.refund > credits {
		t.Fatalf("%d credits, a credit message every %d frames", credits, b.Tr.refund)
	}
	for i := range credits {
		if ok, err := a.Tr.TrySend(1, []byte{byte(i)}); !ok || err != nil {
			t.Fatalf("frame %d: %v, %v", i, ok, err)
		}
	}
	progress(t, ends, func() bool { return len(b.H.Frames[0]) == int(credits) })
	// b consumed them all and owes a their credits, but may not send:
	// another round changes nothing, and a stays out of credits.
	for _, x := range ends {
		if _, err := x.Tr.Progress(x.H); err != nil {
			t.Fatal(err)
		}
	}
	if pb.Ready() || pb.cr.Owed() != credits || !pb.dirty || count(t, b.Tr.m.CreditMsgs) != 0 {
		t.Fatalf("b before it may send: ready %v, owes %d of %d, kept %v, %v credit messages",
			pb.Ready(), pb.cr.Owed(), credits, pb.dirty, count(t, b.Tr.m.CreditMsgs))
	}
	if ok, err := a.Tr.TrySend(1, []byte("more")); ok || err != nil {
		t.Fatalf("a sent beyond its credits: %v, %v", ok, err)
	}

	pb.Acked = true // as XRC's lazy connection does at the reply
	progress(t, ends, func() bool { return pa.cr.Outstanding() == 0 })
	if pb.cr.Owed() != 0 || pb.dirty || count(t, b.Tr.m.CreditMsgs) != 1 || count(t, a.Tr.m.CreditMsgsIn) != 1 {
		t.Fatalf("b once it may send: owes %d, kept %v, %v credit messages sent, %v received",
			pb.cr.Owed(), pb.dirty, count(t, b.Tr.m.CreditMsgs), count(t, a.Tr.m.CreditMsgsIn))
	}
	if ok, err := a.Tr.TrySend(1, []byte("more")); !ok || err != nil {
		t.Fatalf("a with its credits back: %v, %v", ok, err)
	}
	progress(t, ends, func() bool { return len(b.H.Frames[0]) == int(credits)+1 })
	if f := b.H.Frames[0][credits]; string(f) != "more" {
		t.Fatalf("last frame %q", f)
	}
}

// TestCloseWithoutRun: an Endpoint that never ran closes (as a transport
// whose New failed after making it does).
func TestCloseWithoutRun(t *testing.T) {
	_, c := newDevice(t, softhca.Faults{})
	e, err := NewEndpoint(config(c, 0, nil, 8, func() {}))
	if err != nil {
		t.Fatal(errors.Join(err, e.Free()))
	}
	if err := e.Close(e.Free); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(e.Free); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := e.Progress(nil); err == nil || !strings.Contains(err.Error(), "after close") {
		t.Fatalf("progress after close: %v", err)
	}
}

// TestProgressLeavesNoCompletionUnannounced: a Progress that stops polling
// with completions left in the CQ (pollRounds) kicks the rank, since no CQ
// event will announce them: they came before. A rank whose Progress found
// no frame among those it polled went to sleep with frames waiting.
func TestProgressLeavesNoCompletionUnannounced(t *testing.T) {
	a, b, pa, _ := rcPair(t, 1024, true, false) // only Progress kicks b
	ca := pa.Conn
	const n = pollRounds*32 + 50 // more than one Progress polls
	sent := 0
	progress(t, []*end{a}, func() bool {
		for sent < n {
			ok, err := a.Tr.TrySend(1, []byte{byte(sent)})
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			sent++
		}
		return sent == n && ca.sqUsed == 0 // all acknowledged: b's CQ holds them
	})
	select {
	case <-b.K.C:
		t.Fatal("b was kicked before its Progress")
	default:
	}
	k, err := b.Tr.Progress(b.H)
	if err != nil || k >= n {
		t.Fatalf("one Progress: %d frames, %v", k, err)
	}
	select {
	case <-b.K.C:
	default:
		t.Fatalf("a Progress left %d completions in the CQ and did not kick the rank", n-k)
	}
}

// TestArmOnlyBeforeSleep: the CQ is armed only when the rank asks (Arm,
// before it sleeps), and each arm gives at most one kick. A rank that
// polls costs its device no completion events: armed all the time, every
// completion woke a thread of the rank's process while it polled.
func TestArmOnlyBeforeSleep(t *testing.T) {
	a, b, pa, _ := rcPair(t, 64, true, true)
	ca := pa.Conn
	kicked := func(wait time.Duration) bool {
		select {
		case <-b.K.C:
			return true
		case <-time.After(wait):
			return false
		}
	}
	send := func(i int) {
		t.Helper()
		if ok, err := a.Tr.TrySend(1, []byte{byte(i)}); !ok || err != nil {
			t.Fatalf("frame %d: %v, %v", i, ok, err)
		}
		progress(t, []*end{a}, func() bool { return ca.sqUsed == 0 }) // in b's CQ
	}
	deliver := func(want int) {
		t.Helper()
		if _, err := b.Tr.Progress(b.H); err != nil || len(b.H.Frames[0]) != want {
			t.Fatalf("b holds %d frames, want %d: %v", len(b.H.Frames[0]), want, err)
		}
	}

	send(0)
	if kicked(20*time.Millisecond) || count(t, b.Tr.m.CQEvents) != 0 {
		t.Fatalf("a completion in a CQ nobody armed kicked the rank (%v events)", count(t, b.Tr.m.CQEvents))
	}
	deliver(1)

	if err := b.Tr.Arm(); err != nil {
		t.Fatal(err)
	}
	if err := b.Tr.Arm(); err != nil { // armed already: nothing more
		t.Fatal(err)
	}
	deliver(1) // the poll after the arm
	send(1)
	if !kicked(10 * time.Second) {
		t.Fatal("a completion in the armed CQ did not kick the rank")
	}
	deliver(2)
	send(2)
	if kicked(20*time.Millisecond) || count(t, b.Tr.m.CQEvents) != 1 {
		t.Fatalf("an arm gave more than one event: %v", count(t, b.Tr.m.CQEvents))
	}
	deliver(3)
}

// TestArmTakesTheEvent: a rank that sleeps on the completion channel's
// descriptor itself (comm parks in Go's network poller on it), with no
// goroutine watching the CQ, finds the descriptor readable after a
// completion in the armed CQ; its next Arm takes that event, so that the
// descriptor is no longer readable (a sleep would return at once, for
// nothing, every time), and arms the CQ again, so that the next completion
// makes it readable once more.
func TestArmTakesTheEvent(t *testing.T) {
	a, b, pa, _ := rcPair(t, 64, true, false) // nothing watches b's CQ
	ca := pa.Conn
	send := func(i int) {
		t.Helper()
		if ok, err := a.Tr.TrySend(1, []byte{byte(i)}); !ok || err != nil {
			t.Fatalf("frame %d: %v, %v", i, ok, err)
		}
		progress(t, []*end{a}, func() bool { return ca.sqUsed == 0 }) // in b's CQ
	}
	fd := b.Tr.WakeFD()
	if err := b.Tr.Arm(); err != nil {
		t.Fatal(err)
	}
	if xunix.Readable(fd) {
		t.Fatal("the channel is readable before any completion")
	}
	send(0)
	if !xunix.ReadableWithin(fd, 10*time.Second) {
		t.Fatal("a completion in the armed CQ did not make the channel readable")
	}
	if _, err := b.Tr.Progress(b.H); err != nil {
		t.Fatal(err)
	}
	if err := b.Tr.Arm(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, b.Tr.m.CQEvents); n != 1 {
		t.Fatalf("the arm took %v events, want 1", n)
	}
	if xunix.Readable(fd) {
		t.Fatal("the channel is still readable after the arm took its event")
	}
	send(1)
	if !xunix.ReadableWithin(fd, 10*time.Second) {
		t.Fatal("the arm did not arm the CQ again: a completion did not make the channel readable")
	}
	if _, err := b.Tr.Progress(b.H); err != nil || len(b.H.Frames[0]) != 2 {
		t.Fatalf("b holds %d frames, want 2: %v", len(b.H.Frames[0]), err)
	}
}
