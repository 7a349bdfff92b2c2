package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/bootstrap/boottest"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

// world starts a job of n ranks as goroutines of this process, all on node
// 0 unless nodeOf says otherwise, each with its own rendezvous client and
// shared-memory inbox, and returns their world communicators.
func world(t testing.TB, n int, nodeOf func(rank int) int) []*Comm {
	return worldOn(t, n, layout{nodeOf: nodeOf})
}

// layout places a job's ranks on nodes. Every node with ranks gets an
// in-process software HCA, on a fabric shared by the nodes or, with udp,
// speaking RoCEv2 on a loopback address of its own; the ranks of a node
// open it, as the processes of a node open its HCA.
type layout struct {
	name    string
	nodeOf  func(rank int) int
	connect string // "eager" or "lazy"
	// transport is how the nodes are reached: "rc" (default) or "xrc".
	transport string
	udp       bool
	faults    softhca.Faults
	// eager is Config.EagerLimit (0: the default).
	eager int
}

// layouts are the placements the point-to-point suite runs on: one node
// (shared memory only), and two nodes of two ranks, ranks alternating
// (RC or XRC between the nodes), connected at Init or on demand.
var layouts = []layout{
	{name: "OneNode"},
	{name: "TwoNodes", nodeOf: func(r int) int { return r % 2 }},
	{name: "TwoNodesLazy", nodeOf: func(r int) int { return r % 2 }, connect: "lazy"},
	{name: "TwoNodesXRC", nodeOf: func(r int) int { return r % 2 }, transport: "xrc"},
	{name: "TwoNodesXRCLazy", nodeOf: func(r int) int { return r % 2 }, transport: "xrc", connect: "lazy"},
}

// onLayouts runs f as a subtest on every layout.
func onLayouts(t *testing.T, f func(t *testing.T, l layout)) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) { f(t, l) })
	}
}

var devSeq atomic.Uint32

// nodeDevices starts the devices of the nodes of ranks [0, n).
func nodeDevices(t testing.TB, n int, l layout) map[int]*softhca.Device {
	devs := map[int]*softhca.Device{}
	nodes := map[int]bool{}
	for r := range n {
		nodes[l.nodeOf(r)] = true
	}
	if len(nodes) == 1 {
		return devs // a job on one node opens no device
	}
	fab := softhca.NewFabric()
	for r := range n {
		node := l.nodeOf(r)
		if devs[node] != nil {
			continue
		}
		var err error
		for range 20 {
			k := devSeq.Add(1)
			cfg := softhca.Config{Name: fmt.Sprintf("commt%d", k), Faults: l.faults,
				Addr: netip.AddrFrom4([4]byte{127, 1, byte(k >> 8), byte(k)})}
			if l.udp {
				cfg.UDP = true
				cfg.Addr = netip.AddrFrom4([4]byte{127, 64 + byte(mrand.IntN(64)), byte(mrand.IntN(256)), byte(1 + mrand.IntN(254))})
			} else {
				cfg.Fabric = fab
			}
			if devs[node], err = softhca.New(context.Background(), cfg); err == nil || !errors.Is(err, syscall.EADDRINUSE) {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		d := devs[node]
		t.Cleanup(func() {
			if err := d.Close(); err != nil {
				t.Error(err)
			}
			// Credits keep every sender within the receivers' buffers.
			if n := d.Counters().RNRNaksSent.Load(); n > 0 {
				t.Errorf("node %d: %d RNR NAKs sent", node, n)
			}
		})
	}
	return devs
}

// worldOn starts a job of n ranks placed by l.
func worldOn(t testing.TB, n int, l layout) []*Comm {
	t.Helper()
	comms, _ := worldDevs(t, n, l)
	return comms
}

// worldDevs starts a job of n ranks placed by l, and returns the nodes'
// devices too.
func worldDevs(t testing.TB, n int, l layout) ([]*Comm, map[int]*softhca.Device) {
	t.Helper()
	if l.nodeOf == nil {
		l.nodeOf = func(int) int { return 0 }
	}
	nodeOf := l.nodeOf
	devs := nodeDevices(t, n, l)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	addr, key := boottest.Server(t, n)
	dir := t.TempDir()
	local := map[int]int{}
	for r := range n {
		local[nodeOf(r)]++
	}
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	seen := map[int]int{}
	for r := range n {
		node := nodeOf(r)
		lr := seen[node]
		seen[node]++
		wg.Go(func() {
			env := bootstrap.Env{Rank: r, Size: n, LocalRank: lr, LocalSize: local[node], Node: node, Nodes: len(local),
				Addr: addr, Key: key, JobID: "t", Connect: l.connect, Transport: l.transport}
			c, err := bootstrap.Join(ctx, env.Addr, key, bootstrap.Member{Rank: r, Node: node, LocalRank: lr}, n, bootstrap.ClientConfig{})
			if err != nil {
				errs[r] = err
				return
			}
			open := func(ctx context.Context, env *bootstrap.Env) (*verbs.Context, error) {
				return devs[env.Node].Open(verbs.Config{})
			}
			comms[r], errs[r] = Init(ctx, Config{Bootstrap: c, Env: &env, Dir: dir, NoPull: noPull, OpenDevice: open, EagerLimit: l.eager})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, c := range comms {
			if finalized(c) { // by the test
				continue
			}
			wg.Go(func() {
				if err := c.Finalize(ctx); err != nil {
					t.Errorf("finalize rank %d: %v", c.Rank(), err)
				}
			})
		}
		wg.Wait()
	})
	return comms, devs
}

// each runs f on every rank at once and fails the test with their errors.
// The first error ends the others' context: they may be waiting for the
// rank that failed.
func each(t *testing.T, comms []*Comm, f func(ctx context.Context, c *Comm) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Go(func() {
			if err := f(ctx, c); err != nil {
				errs[i] = fmt.Errorf("rank %d: %w", i, err)
				cancel()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func pattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seed*131 + i*7 + i>>8)
	}
	return b
}

// TestPairs: every rank sends to every rank (itself included) messages of
// sizes from 0 bytes to several times the eager limit; all arrive intact,
// in order per sender and tag.
func TestPairs(t *testing.T) { onLayouts(t, testPairs) }

// TestPairsNoPull: the same on one node when large messages cannot be
// pulled and are pushed through the rings.
func TestPairsNoPull(t *testing.T) {
	noPull = true
	defer func() { noPull = false }()
	testPairs(t, layout{name: "OneNode"})
}

// noPull makes world's ranks push large messages instead of pulling them.
var noPull bool

func testPairs(t *testing.T, l layout) {
	comms := worldOn(t, 4, l)
	sizes := []int{0, 1, 100, 8 << 10, 8<<10 + 1, 100 << 10, 1 << 20}
	each(t, comms, func(ctx context.Context, c *Comm) error {
		var reqs []*Request
		bufs := map[[3]int][]byte{}
		for src := range c.Size() {
			for i, n := range sizes {
				b := make([]byte, n)
				bufs[[3]int{src, i}] = b
				r, err := c.Irecv(b, src, 5)
				if err != nil {
					return err
				}
				reqs = append(reqs, r)
			}
		}
		for dst := range c.Size() {
			for _, n := range sizes {
				r, err := c.Isend(pattern(c.Rank()*1000+dst*10+n%7, n), dst, 5)
				if err != nil {
					return err
				}
				reqs = append(reqs, r)
			}
		}
		if _, err := Waitall(ctx, reqs...); err != nil {
			return err
		}
		for src := range c.Size() {
			for i, n := range sizes {
				if !bytes.Equal(bufs[[3]int{src, i}], pattern(src*1000+c.Rank()*10+n%7, n)) {
					return fmt.Errorf("message %d (%d bytes) from %d differs", i, n, src)
				}
			}
		}
		return nil
	})
}

// TestOrderAndWildcards: many messages on two tags from every rank to
// rank 0, received with AnySource/AnyTag, keep their order per (source,
// tag); statuses say who sent what.
func TestOrderAndWildcards(t *testing.T) { onLayouts(t, testOrderAndWildcards) }

func testOrderAndWildcards(t *testing.T, l layout) {
	comms := worldOn(t, 4, l)
	const per = 200
	each(t, comms, func(ctx context.Context, c *Comm) error {
		if c.Rank() != 0 {
			for i := range per {
				for tag := range 2 {
					n := 8
					if i%50 == 7 {
						n = 64 << 10 // a rendezvous in the stream
					}
					b := pattern(i, n)
					copy(b, fmt.Sprintf("%04d", i))
					if err := c.Send(ctx, b, 0, tag); err != nil {
						return err
					}
				}
			}
			return nil
		}
		next := map[[2]int]int{}
		buf := make([]byte, 64<<10)
		for range 2 * per * (c.Size() - 1) {
			st, err := c.Recv(ctx, buf, AnySource, AnyTag)
			if err != nil {
				return err
			}
			k := [2]int{st.Source, st.Tag}
			if got := string(buf[:4]); got != fmt.Sprintf("%04d", next[k]) {
				return fmt.Errorf("from %d tag %d: message %s, want %d", st.Source, st.Tag, got, next[k])
			}
			next[k]++
		}
		return nil
	})
}

// TestTruncateProbeSelf: a receive shorter than its message gets its first
// bytes and ErrTruncate, as a *TruncateError with the message's length
// (eager and rendezvous); Probe and Iprobe see a
// message without taking it; a rank sends to itself.
func TestTruncateProbeSelf(t *testing.T) { onLayouts(t, testTruncateProbeSelf) }

func testTruncateProbeSelf(t *testing.T, l layout) {
	comms := worldOn(t, 4, l)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		if c.Rank() > 1 {
			return nil
		}
		if c.Rank() == 1 {
			for _, n := range []int{100, 200 << 10, 33} {
				if err := c.Send(ctx, pattern(n, n), 0, 9); err != nil {
					return err
				}
			}
			return nil
		}
		for _, n := range []int{100, 200 << 10} {
			st, err := c.Probe(ctx, 1, 9)
			if err != nil || st.Count != n || st.Source != 1 || st.Tag != 9 {
				return fmt.Errorf("probe: %+v, %v; want %d bytes", st, err, n)
			}
			b := make([]byte, 10)
			st, err = c.Recv(ctx, b, 1, 9)
			if !errors.Is(err, ErrTruncate) || st.Count != 10 || !bytes.Equal(b, pattern(n, n)[:10]) {
				return fmt.Errorf("truncated receive of %d: %+v, %v", n, st, err)
			}
			if te := (*TruncateError)(nil); !errors.As(err, &te) || te.Len != n || te.Cap != 10 {
				return fmt.Errorf("truncated receive of %d: %v: want a *TruncateError of %d bytes into 10", n, err, n)
			}
		}
		// Iprobe eventually sees the last one.
		for {
			ok, st, err := c.Iprobe(AnySource, AnyTag)
			if err != nil {
				return err
			}
			if ok {
				if st.Count != 33 {
					return fmt.Errorf("iprobe: %+v", st)
				}
				break
			}
		}
		if _, err := c.Recv(ctx, make([]byte, 33), 1, 9); err != nil {
			return err
		}
		// To itself, eager and rendezvous.
		for _, n := range []int{5, 1 << 20} {
			r, err := c.Irecv(make([]byte, n), 0, 1)
			if err != nil {
				return err
			}
			if err := c.Send(ctx, pattern(n, n), 0, 1); err != nil {
				return err
			}
			if st, err := r.Wait(ctx); err != nil || st.Count != n {
				return fmt.Errorf("self %d: %+v, %v", n, st, err)
			}
		}
		if ok, _, _ := c.Iprobe(AnySource, AnyTag); ok {
			return errors.New("iprobe finds a message nobody sent")
		}
		return nil
	})
}

// TestSplit: Split by parity with reversed keys, Dup and SplitByNode make
// communicators whose traffic stays apart from the world's.
func TestSplit(t *testing.T) { onLayouts(t, testSplit) }

func testSplit(t *testing.T, l layout) {
	comms := worldOn(t, 4, l)
	nodeOf := l.nodeOf
	if nodeOf == nil {
		nodeOf = func(int) int { return 0 }
	}
	each(t, comms, func(ctx context.Context, w *Comm) error {
		half, err := w.Split(ctx, w.Rank()%2, -w.Rank())
		if err != nil {
			return err
		}
		if half.Size() != 2 || half.Rank() != 1-w.Rank()/2 {
			return fmt.Errorf("split: rank %d of %d", half.Rank(), half.Size())
		}
		dup, err := w.Dup(ctx)
		if err != nil {
			return err
		}
		node, err := w.SplitByNode(ctx)
		size, rank := 0, 0
		for r := range 4 {
			if nodeOf(r) == nodeOf(w.Rank()) {
				if r < w.Rank() {
					rank++
				}
				size++
			}
		}
		if err != nil || node.Size() != size || node.Rank() != rank {
			return fmt.Errorf("split by node: %v", err)
		}
		none, err := w.Split(ctx, Undefined, 0)
		if err != nil || none != nil {
			return fmt.Errorf("undefined color: %v, %v", none, err)
		}
		// The same tag on three communicators: each receive gets its
		// own communicator's message.
		peer := half.Rank() ^ 1
		b1, b2 := make([]byte, 4), make([]byte, 4)
		r1, _ := half.Irecv(b1, peer, 3)
		r2, _ := dup.Irecv(b2, AnySource, 3)
		if err := dup.Send(ctx, []byte("dup!"), (dup.Rank()+1)%4, 3); err != nil {
			return err
		}
		if err := half.Send(ctx, []byte("half"), peer, 3); err != nil {
			return err
		}
		if _, err := Waitall(ctx, r1, r2); err != nil {
			return err
		}
		if string(b1) != "half" || string(b2) != "dup!" {
			return fmt.Errorf("got %q on half, %q on dup", b1, b2)
		}
		// Sendrecv around the ring.
		out := []byte{byte(w.Rank())}
		in := make([]byte, 1)
		st, err := w.Sendrecv(ctx, out, (w.Rank()+1)%4, 0, in, (w.Rank()+3)%4, 0)
		if err != nil || int(in[0]) != (w.Rank()+3)%4 || st.Source != (w.Rank()+3)%4 {
			return fmt.Errorf("sendrecv: %v %v", in, err)
		}
		return nil
	})
}

// TestManyOutstanding: thousands of non-blocking sends and receives in
// flight at once, more than the rings hold, complete with Waitany.
func TestManyOutstanding(t *testing.T) { onLayouts(t, testManyOutstanding) }

func testManyOutstanding(t *testing.T, l layout) {
	comms := worldOn(t, 4, l)
	const n = 3000
	each(t, comms, func(ctx context.Context, c *Comm) error {
		peer := c.Rank() ^ 1
		var reqs []*Request
		for i := range n {
			b := make([]byte, 512)
			r, err := c.Irecv(b, peer, i%7)
			if err != nil {
				return err
			}
			reqs = append(reqs, r)
		}
		for i := range n {
			r, err := c.Isend(pattern(i, 512), peer, i%7)
			if err != nil {
				return err
			}
			reqs = append(reqs, r)
		}
		left := len(reqs)
		for left > 0 {
			i, _, err := Waitany(ctx, reqs...)
			if err != nil {
				return err
			}
			reqs[i] = reqs[len(reqs)-1]
			reqs = reqs[:len(reqs)-1]
			left--
		}
		return nil
	})
}

// TestTransportChoice: an unknown transport or connection mode is
// refused with a clear error; xrc is taken.
func TestTransportChoice(t *testing.T) {
	if f, err := chooseFabric(&Config{Transport: "XRC"}, &bootstrap.Env{}); err != nil || f.transport != "xrc" || f.lazy {
		t.Errorf("xrc: %+v, %v", f, err)
	}
	for _, tc := range []struct{ transport, connect, want string }{
		{"tcp", "", "unknown transport"},
		{"rc", "sometimes", "unknown connection mode"},
	} {
		_, err := chooseFabric(&Config{Transport: tc.transport, Connect: tc.connect}, &bootstrap.Env{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s/%s: %v", tc.transport, tc.connect, err)
		}
	}
	if f, err := chooseFabric(&Config{}, &bootstrap.Env{Transport: "auto", Connect: "lazy"}); err != nil || f.transport != "rc" || !f.lazy {
		t.Errorf("auto, lazy: %+v, %v", f, err)
	}
}

// BenchmarkPingPong: 8 bytes there and back between two ranks of a node
// (goroutines of this process, each with its own engine and inbox); ns/op
// is the round trip.
func BenchmarkPingPong(b *testing.B) {
	for _, size := range []int{8, 1 << 20} {
		b.Run(fmt.Sprint(size), func(b *testing.B) { benchPingPong(b, size) })
	}
}

func benchPingPong(b *testing.B, size int) {
	pp, done := pingPong(b, world(b, 2, nil), size, b.N+1)
	pp()
	b.SetBytes(int64(2 * size))
	b.ResetTimer()
	for range b.N {
		pp()
	}
	b.StopTimer()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2000, "us-one-way")
}

// BenchmarkSleepingPingPong: 8 bytes there and back between two ranks on
// two nodes (goroutines of this process, over RC or XRC), which sleep on
// their bells as soon as they find nothing, instead of polling first: the
// wake-ups of a device's completions. It reports the round trip's median
// and 99th percentile, and the share of round trips of 5 ms or more.
// With -cpu 2 the two sleeping ranks held both Ps in the bell's futex,
// and a completion's kick, which a goroutine of the transport gives once
// Go's network poller has read the CQ's event, waited until the runtime's
// monitor freed a P (every 20 µs to 10 ms); now a sleeping rank parks in
// the network poller on its bell and its CQ's channel, and holds no P.
func BenchmarkSleepingPingPong(b *testing.B) {
	for _, tr := range []string{"rc", "xrc"} {
		b.Run(tr, func(b *testing.B) {
			comms := worldOn(b, 2, layout{nodeOf: func(r int) int { return r }, transport: tr})
			for _, c := range comms {
				c.e.mu.Lock()
				c.e.spin, c.e.yield = -1, -1
				c.e.mu.Unlock()
			}
			pp, done := pingPong(b, comms, 8, b.N+1)
			pp()
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				pp()
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			slices.Sort(lat)
			slow, _ := slices.BinarySearch(lat, 5*time.Millisecond)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-us")
			b.ReportMetric(100*float64(len(lat)-slow)/float64(len(lat)), "slow-%")
		})
	}
}

// pingPong starts rank 1 of comms echoing rounds messages of size bytes
// back to rank 0, and returns the round trip rank 0 makes and the channel
// that gets the echo's end.
func pingPong(tb testing.TB, comms []*Comm, size, rounds int) (func(), <-chan error) {
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for range rounds {
			if _, err := comms[1].Recv(ctx, buf, 0, 0); err != nil {
				done <- err
				return
			}
			if err := comms[1].Send(ctx, buf, 0, 0); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	buf := make([]byte, size)
	return func() {
		if err := comms[0].Send(ctx, buf, 1, 0); err != nil {
			tb.Fatal(err)
		}
		if _, err := comms[0].Recv(ctx, buf, 1, 0); err != nil {
			tb.Fatal(err)
		}
	}, done
}

// TestXRCObjects: a job of two nodes of two ranks over XRC, connected at
// Init, holds on each node's device one XRC domain, two XRC SRQs (one per
// rank) and four QPs: two INI QPs (one per rank, toward the other node)
// and two TGT QPs (one per rank of the other node), against four RC QPs
// per node with RC.
func TestXRCObjects(t *testing.T) {
	l := layout{nodeOf: func(r int) int { return r % 2 }, transport: "xrc"}
	comms, devs := worldDevs(t, 4, l)
	for node, d := range devs {
		if o := d.Objects(); o.XRCDs != 1 || o.SRQs != 2 || o.QPs != 4 {
			t.Errorf("node %d: %+v, want 1 XRC domain, 2 SRQs, 4 QPs", node, o)
		}
	}
	each(t, comms, func(ctx context.Context, c *Comm) error {
		peer := (c.Rank() + 1) % c.Size()
		from := (c.Rank() + c.Size() - 1) % c.Size()
		got := make([]byte, 5)
		r, err := c.Irecv(got, from, 0)
		if err != nil {
			return err
		}
		if _, err := c.Isend([]byte("hello"), peer, 0); err != nil {
			return err
		}
		_, err = Waitall(ctx, r)
		if err == nil && string(got) != "hello" {
			err = fmt.Errorf("got %q", got)
		}
		return err
	})
}

// TestDefaultYield: a rank polls with sched_yield only when it does not
// spin (the node's ranks outnumber the CPUs) in a job on one node.
func TestDefaultYield(t *testing.T) {
	for _, c := range []struct {
		spin  time.Duration
		nodes int
		want  time.Duration
	}{
		{-1, 1, 200 * time.Microsecond},
		{-1, 0, 200 * time.Microsecond}, // a world of one, without a launcher
		{-1, 2, -1},
		{time.Millisecond, 1, -1},
	} {
		if got := defaultYield(c.spin, c.nodes); got != c.want {
			t.Errorf("spin %v, %d nodes: %v, want %v", c.spin, c.nodes, got, c.want)
		}
	}
}

// TestSleepingRankWokenByCompletion: ranks of one process, as many as its
// Ps (one or two), that sleep as soon as they find nothing, are woken by
// their devices' completions within milliseconds, though each has slept
// longer than any first naps (rank 1 answers 2 ms after it got a message).
// Asleep in a futex, they held the Ps, and a completion's kick (a
// goroutine's) and the in-process devices' work waited for Go's monitor
// to take one back, up to 10 ms at each step.
func TestSleepingRankWokenByCompletion(t *testing.T) {
	for _, procs := range []int{1, 2} {
		t.Run(fmt.Sprint(procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			comms := worldOn(t, 2, layout{nodeOf: func(r int) int { return r }, transport: "rc"})
			for _, c := range comms {
				c.e.mu.Lock()
				c.e.spin, c.e.yield = -1, -1
				c.e.mu.Unlock()
			}
			ctx := context.Background()
			const rounds, pause = 40, 2 * time.Millisecond
			done := make(chan error, 1)
			go func() {
				buf := make([]byte, 8)
				for range rounds {
					if _, err := comms[1].Recv(ctx, buf, 0, 0); err != nil {
						done <- err
						return
					}
					time.Sleep(pause)
					if err := comms[1].Send(ctx, buf, 0, 0); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			buf := make([]byte, 8)
			var late []time.Duration
			for range rounds {
				start := time.Now()
				if err := comms[0].Send(ctx, buf, 1, 0); err != nil {
					t.Fatal(err)
				}
				if _, err := comms[0].Recv(ctx, buf, 1, 0); err != nil {
					t.Fatal(err)
				}
				if d := time.Since(start) - pause; d >= 5*time.Millisecond {
					late = append(late, d)
				}
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			// Woken late, every round trip was (9.5 to 11.5 ms); on a
			// loaded machine some may be late for other reasons.
			if len(late) > rounds/2 {
				t.Fatalf("%d of %d round trips took 5 ms or more besides rank 1's pause: %v", len(late), rounds, late)
			}
		})
	}
}
