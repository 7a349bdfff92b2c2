package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"syscall"
	"testing"
	"time"
)

// TestRecvContextRace: a Recv whose context ends just as its message
// completes returns the message, not the context's error. It used to
// return the error with the message in buf and gone from the queue: lost.
// Another goroutine drives rank 0's progress, so that the completion can
// come while Recv waits on its context.
func TestRecvContextRace(t *testing.T) {
	comms := world(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := comms[0]
	dctx, dcancel := context.WithCancel(ctx)
	driven := make(chan struct{})
	go func() { c.Recv(dctx, make([]byte, 8), 1, 1<<30); close(driven) }()
	defer func() { dcancel(); <-driven }()
	timedOut := 0
	for i := range 2000 {
		d := time.Duration(50+i%100) * time.Microsecond
		go func() {
			time.Sleep(d)
			comms[1].Send(ctx, []byte{byte(i), 1, 2, 3}, 0, i)
		}()
		buf := make([]byte, 4)
		rctx, stop := context.WithTimeout(ctx, d)
		_, err := c.Recv(rctx, buf, 1, i)
		stop()
		if err == nil {
			continue
		}
		timedOut++
		if buf[1] == 1 {
			t.Fatalf("message %d: Recv returned %v with the message in buf", i, err)
		}
		if _, err := c.Recv(ctx, buf, 1, i); err != nil || buf[0] != byte(i) {
			t.Fatalf("message %d after a Recv that timed out: %v, %v", i, buf, err)
		}
	}
	t.Logf("%d of 2000 Recvs timed out before their message matched", timedOut)
}

// TestSendrecvContextAfterMatch: a Sendrecv whose context ends after its
// receive has matched a message still on its way receives it, as Recv
// does. It used to return the context's error while the message went on
// into rbuf, taken from every later receive.
func TestSendrecvContextAfterMatch(t *testing.T) {
	noPull = true // the receiver waits for rank 1 to push the message
	defer func() { noPull = false }()
	comms := world(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const size = 100000 // rendezvous
	s, err := comms[1].Isend(pattern(7, size), 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	// Rank 1 pushes only once rank 0's Sendrecv has waited past its
	// context.
	go func() {
		time.Sleep(200 * time.Millisecond)
		s.Wait(ctx)
	}()
	rbuf := make([]byte, size)
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	st, err := comms[0].Sendrecv(short, nil, 0, 50, rbuf, 1, 3) // to itself, from rank 1
	stop()
	if err != nil || st.Count != size || !bytes.Equal(rbuf, pattern(7, size)) {
		t.Fatalf("Sendrecv: %+v, %v", st, err)
	}
	if _, err := comms[0].Recv(ctx, nil, 0, 50); err != nil { // its send to itself
		t.Fatal(err)
	}
}

// TestSendrecvChecksFirst: a Sendrecv whose send is refused (a rank out of
// range) receives nothing: it used to take a waiting message into rbuf
// and drop it.
func TestSendrecvChecksFirst(t *testing.T) {
	comms := world(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := comms[1].Send(ctx, []byte("hello"), 0, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := comms[0].Probe(ctx, 1, 3); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][2]int{{7, 0}, {1, -5}} { // a rank, a tag
		if _, err := comms[0].Sendrecv(ctx, []byte("x"), bad[0], bad[1], make([]byte, 5), 1, 3); err == nil {
			t.Fatalf("Sendrecv to rank %d with tag %d succeeded", bad[0], bad[1])
		}
	}
	if ok, _, _ := comms[0].Iprobe(1, 3); !ok {
		t.Fatal("the message is gone after Sendrecvs that failed their argument check")
	}
}

// TestConcurrentDup: two Dups of a communicator from two goroutines, the
// second started once the first has taken its turn, pair up by that order
// on every rank. The new context was numbered in the order the calls
// ended, which can differ between ranks: the first Dup's communicator of
// one rank talked to the second's of the other.
func TestConcurrentDup(t *testing.T) {
	comms := world(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Another goroutine drives rank 0's progress.
	dctx, dcancel := context.WithCancel(ctx)
	driven := make(chan struct{})
	go func() { comms[0].Recv(dctx, make([]byte, 1), 1, 1<<30); close(driven) }()
	defer func() { dcancel(); <-driven }()
	turn := func(c *Comm) int32 { c.e.mu.Lock(); defer c.e.mu.Unlock(); return c.coll }
	for round := range 200 {
		var firsts, seconds [2]uint32
		each(t, comms, func(ctx context.Context, c *Comm) error {
			before := turn(c)
			errs := make(chan error, 2)
			dup := func(into *[2]uint32) {
				n, err := c.Dup(ctx)
				if err == nil {
					into[c.Rank()] = n.ctx
				}
				errs <- err
			}
			go dup(&firsts)
			for turn(c) == before {
				time.Sleep(time.Microsecond)
			}
			go dup(&seconds)
			return errors.Join(<-errs, <-errs)
		})
		if firsts[0] != firsts[1] || seconds[0] != seconds[1] {
			t.Fatalf("round %d: the first Dup's context is %#x on rank 0 and %#x on rank 1, the second's %#x and %#x",
				round, firsts[0], firsts[1], seconds[0], seconds[1])
		}
	}
}

// TestProbeWaitsIdle: a Probe that waits while another goroutine drives
// progress sleeps, also after a message it does not match came. It used
// to spin on that message's closed channel, a CPU's worth.
func TestProbeWaitsIdle(t *testing.T) {
	comms := world(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := comms[0]
	dctx, dcancel := context.WithCancel(ctx)
	driven := make(chan struct{})
	go func() { c.Recv(dctx, make([]byte, 8), 1, 99); close(driven) }()
	defer func() { dcancel(); <-driven }()
	time.Sleep(20 * time.Millisecond)
	pctx, pcancel := context.WithCancel(ctx)
	probed := make(chan struct{})
	go func() { c.Probe(pctx, 1, 5); close(probed) }()
	defer func() { pcancel(); <-probed }()
	if err := comms[1].Send(ctx, []byte("x"), 0, 7); err != nil { // matches neither
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	c0, w0 := cpu(), time.Now()
	time.Sleep(500 * time.Millisecond)
	if used, wall := cpu()-c0, time.Since(w0); used > wall/2 {
		t.Errorf("waiting, the process used %v of CPU in %v", used, wall)
	}
}

// TestSplitKeyOrder: Split orders ranks by key over the whole range of
// int; the difference of two keys overflowed.
func TestSplitKeyOrder(t *testing.T) {
	comms := world(t, 3, nil)
	keys := []int{1, math.MinInt, math.MaxInt}
	got := make([]int, 3)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		n, err := c.Split(ctx, 0, keys[c.Rank()])
		if err == nil {
			got[c.Rank()] = n.Rank()
		}
		return err
	})
	if want := []int{1, 0, 2}; !slices.Equal(got, want) {
		t.Errorf("ranks by key %v: %v, want %v", keys, got, want)
	}
}

// TestNilRequests: a nil request is MPI's MPI_REQUEST_NULL: done, with an
// empty status, and left out by Waitany. They panicked.
func TestNilRequests(t *testing.T) {
	c := world(t, 1, nil)[0]
	ctx := context.Background()
	s, err := c.Isend([]byte{1}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Irecv(make([]byte, 1), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if i, st, err := Waitany(ctx, nil, r); i != 1 || st.Count != 1 || err != nil {
		t.Errorf("Waitany(nil, r): %d, %+v, %v", i, st, err)
	}
	if i, _, err := Waitany(ctx, nil, nil); i != -1 || err != nil {
		t.Errorf("Waitany(nil, nil): %d, %v", i, err)
	}
	if i, _, err := Waitany(ctx); i != -1 || err != nil {
		t.Errorf("Waitany(): %d, %v, want -1 and no error, as for all nil", i, err)
	}
	if sts, err := Waitall(ctx, s, nil, r); err != nil || len(sts) != 3 || sts[1] != (Status{}) {
		t.Errorf("Waitall(s, nil, r): %+v, %v", sts, err)
	}
	if !Testall(nil, s, nil) {
		t.Error("Testall(nil, s, nil) of done requests: false")
	}
	var null *Request
	if ok, st, err := null.Test(); !ok || st != (Status{}) || err != nil {
		t.Errorf("Test of nil: %v, %+v, %v", ok, st, err)
	}
	if st, err := null.Wait(ctx); st != (Status{}) || err != nil {
		t.Errorf("Wait of nil: %+v, %v", st, err)
	}
	if null.Cancel() {
		t.Error("Cancel of nil: true")
	}
}

// TestNonCommutative: reductions apply an operation that does not
// commute in rank order (2×2 matrix products), on rank counts that are
// not powers of two.
func TestNonCommutative(t *testing.T) {
	matMul := func(dst, a, b []int64) {
		const p = 1000003
		for k := 0; k+4 <= len(dst); k += 4 {
			x, y := a[k:k+4], b[k:k+4]
			r := [4]int64{(x[0]*y[0] + x[1]*y[2]) % p, (x[0]*y[1] + x[1]*y[3]) % p,
				(x[2]*y[0] + x[3]*y[2]) % p, (x[2]*y[1] + x[3]*y[3]) % p}
			copy(dst[k:k+4], r[:])
		}
	}
	mat := func(r, k int) []int64 { // k matrices of rank r
		v := make([]int64, 4*k)
		for i := range k {
			v[4*i], v[4*i+1], v[4*i+2], v[4*i+3] = int64(r+2+i), int64(3*r+1), int64(r*r+i), int64(7+r)
		}
		return v
	}
	prod := func(lo, hi, k int) []int64 { // of ranks lo..hi, in order
		acc := mat(lo, k)
		for r := lo + 1; r <= hi; r++ {
			matMul(acc, acc, mat(r, k))
		}
		return acc
	}
	for _, n := range []int{3, 5, 6} {
		comms := world(t, n, nil)
		const k = 3
		each(t, comms, func(ctx context.Context, c *Comm) error {
			me := c.Rank()
			send, recv := mat(me, k), make([]int64, 4*k)
			for _, root := range []int{0, 1, n - 1} {
				if err := Reduce(ctx, c, send, recv, matMul, root); err != nil {
					return err
				}
				if me == root && !slices.Equal(recv, prod(0, n-1, k)) {
					return fmt.Errorf("%d ranks: Reduce to %d: %v", n, root, recv)
				}
			}
			if err := Allreduce(ctx, c, send, recv, matMul); err != nil || !slices.Equal(recv, prod(0, n-1, k)) {
				return fmt.Errorf("%d ranks: Allreduce: %v, %v", n, recv, err)
			}
			if err := Scan(ctx, c, send, recv, matMul); err != nil || !slices.Equal(recv, prod(0, me, k)) {
				return fmt.Errorf("%d ranks: Scan on %d: %v, %v", n, me, recv, err)
			}
			if err := Exscan(ctx, c, send, recv, matMul); err != nil || me > 0 && !slices.Equal(recv, prod(0, me-1, k)) {
				return fmt.Errorf("%d ranks: Exscan on %d: %v, %v", n, me, recv, err)
			}
			var blocks []int64 // block b: matrix 10·me+b
			for b := range n {
				blocks = append(blocks, mat(10*me+b, 1)...)
			}
			out, want := make([]int64, 4), mat(me, 1)
			for r := 1; r < n; r++ {
				matMul(want, want, mat(10*r+me, 1))
			}
			if err := ReduceScatterBlock(ctx, c, blocks, out, matMul); err != nil || !slices.Equal(out, want) {
				return fmt.Errorf("%d ranks: ReduceScatterBlock on %d: %v, %v", n, me, out, err)
			}
			return nil
		})
	}
}

// TestSplitContextCollision: two Splits whose new communicators' first
// candidate context ids collide on a rank that is in both. The ranks agree
// on ids (a rank whose candidate is taken makes them all try the next), so
// both Splits succeed everywhere and the new communicators work. Before,
// the second Split failed on rank 0 alone ("context id … is in use") and
// rank 2 hung in the first collective of a communicator rank 0 did not
// have.
func TestSplitContextCollision(t *testing.T) {
	comms := world(t, 3, nil)
	s1 := int(comms[0].coll)
	for _, c := range comms {
		if int(c.coll) != s1 {
			t.Fatal("ranks disagree on the collective sequence number")
		}
	}
	// Colors c1 (split at s1) and c2 (split at s1+1) with the same first
	// candidate id. Colors are arbitrary non-negative ints (hashes of host
	// names, say); the search is deterministic.
	color := func(i int) int { return int(uint64(i) * 0x9e3779b97f4a7c15 >> 1) }
	first := map[uint32]int{}
	for i := range 1 << 17 {
		first[splitContext(0, s1, color(i), 0)] = color(i)
	}
	c1, c2 := -1, -1
	for i := range 1 << 20 {
		if o, ok := first[splitContext(0, s1+1, color(i), 0)]; ok {
			c1, c2 = o, color(i)
			break
		}
	}
	if c1 < 0 {
		t.Fatal("no colliding colors found")
	}
	// Split 1: ranks 0 and 1 take color c1, rank 2 none. Split 2: ranks 0
	// and 2 take color c2, rank 1 none.
	var ids [3][2]uint32
	each(t, comms, func(ctx context.Context, c *Comm) error {
		r := c.Rank()
		col := Undefined
		if r < 2 {
			col = c1
		}
		a, err := c.Split(ctx, col, 0)
		if err != nil {
			return err
		}
		col = Undefined
		if r != 1 {
			col = c2
		}
		b, err := c.Split(ctx, col, 0)
		if err != nil {
			return err
		}
		for i, n := range []*Comm{a, b} {
			if n != nil {
				ids[r][i] = n.ctx
				if err := n.Barrier(ctx); err != nil {
					return fmt.Errorf("split %d: %w", i+1, err)
				}
			}
		}
		return nil
	})
	if ids[0][0] != ids[1][0] || ids[0][1] != ids[2][1] || ids[0][0] == ids[0][1] {
		t.Fatalf("context ids by rank (split 1, split 2): %#x", ids)
	}
}

// TestReduceScatterCountOverflow: counts whose sum overflows int are
// refused; they passed the length check, and in place ReduceScatter
// panicked slicing the receive buffer.
func TestReduceScatterCountOverflow(t *testing.T) {
	comms := world(t, 4, nil)
	counts := []int{1 << 62, 1 << 62, 1 << 62, 1 << 62} // sum ≡ 0 mod 2^64
	each(t, comms, func(ctx context.Context, c *Comm) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		if err := ReduceScatter(ctx, c, nil, []int64{}, counts, Sum); err == nil {
			return errors.New("ReduceScatter with counts of 2^62 each: no error")
		}
		return nil
	})
}

// TestBadRootTakesTurn: a collective refused on one rank for its root
// still takes its turn there, as the package promises, so that the next
// collectives pair up. The root was checked before the turn was taken:
// rank 1's next Bcast took the refused one's turn and got its data.
func TestBadRootTakesTurn(t *testing.T) {
	comms := world(t, 3, nil)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		root := 0
		if c.Rank() == 1 {
			root = 99
		}
		buf := []byte("first")
		if c.Rank() != 0 {
			buf = make([]byte, 5)
		}
		err := c.Bcast(ctx, buf, root)
		if (err != nil) != (c.Rank() == 1) {
			return fmt.Errorf("bcast with root %d: %v", root, err)
		}
		r := c.Ibcast(ctx, buf, root)
		if _, err := r.Wait(ctx); (err != nil) != (c.Rank() == 1) {
			return fmt.Errorf("ibcast with root %d: %v", root, err)
		}
		next := []byte("again")
		if c.Rank() != 0 {
			next = make([]byte, 5)
		}
		if err := c.Bcast(ctx, next, 0); err != nil {
			return err
		}
		if string(next) != "again" {
			return fmt.Errorf("the next bcast gave %q", next)
		}
		return nil
	})
}

// TestPeerFailed: a transport says it no longer carries traffic from rank
// 1 (shm does so for a peer whose ring was corrupt). Rank 0's receive from
// rank 1 fails with the transport's error, as does a later one; its
// receives from rank 2 and from any source still get rank 2's messages.
// Before, the receive from rank 1 waited until its context ended.
func TestPeerFailed(t *testing.T) {
	w := world(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	from1, err := w[0].Irecv(make([]byte, 8), 1, 5)
	if err != nil {
		t.Fatal(err)
	}
	from2, err := w[0].Irecv(make([]byte, 8), 2, 5)
	if err != nil {
		t.Fatal(err)
	}
	anyone, err := w[0].Irecv(make([]byte, 8), AnySource, 6)
	if err != nil {
		t.Fatal(err)
	}
	broken := errors.New("test: ring of rank 1 corrupt")
	failPeer(w[0], 1, broken)
	if _, err := from1.Wait(ctx); !errors.Is(err, broken) {
		t.Fatalf("receive from the failed rank: %v, want its error", err)
	}
	if _, err := w[0].Irecv(make([]byte, 8), 1, 5); !errors.Is(err, broken) {
		t.Fatalf("a later receive from the failed rank: %v, want its error", err)
	}
	for _, tag := range []int{5, 6} {
		if err := w[2].Send(ctx, []byte("rank 2"), 0, tag); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []*Request{from2, anyone} {
		if st, err := r.Wait(ctx); err != nil || st.Source != 2 {
			t.Fatalf("receive of rank 2's message: %+v, %v", st, err)
		}
	}
}

// TestPeerFailedProbe: once a transport said rank 1's traffic is gone for
// good, a Probe or Mprobe for rank 1 should fail with its error, as a
// receive does; they wait until their context ends (probe does not look at
// peerErr, and PeerFailed does not close e.arrived, so a Probe already
// waiting is not woken either).
func TestPeerFailedProbe(t *testing.T) {
	w := world(t, 2, nil)
	broken := errors.New("test: ring of rank 1 corrupt")
	failPeer(w[0], 1, broken)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := w[0].Probe(ctx, 1, 5); !errors.Is(err, broken) {
		t.Errorf("Probe of the failed rank: %v, want its error", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	if _, err := w[0].Mprobe(ctx2, 1, 5); !errors.Is(err, broken) {
		t.Errorf("Mprobe of the failed rank: %v, want its error", err)
	}
}

// TestPeerFailedRendezvousSend: a rendezvous send to rank 1, announced
// before the transport said rank 1's traffic is gone, waits for a finish
// frame that can no longer come: it should fail with the peer's error,
// but waits until its context ends (PeerFailed looks only at e.posted, not
// e.sends, nor e.pushes).
func TestPeerFailedRendezvousSend(t *testing.T) {
	w := world(t, 2, nil)
	big, err := w[0].Isend(make([]byte, 1<<20), 1, 8)
	if err != nil {
		t.Fatal(err)
	}
	broken := errors.New("test: ring of rank 1 corrupt")
	failPeer(w[0], 1, broken)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := big.Wait(ctx); !errors.Is(err, broken) {
		t.Errorf("rendezvous send to the failed rank: %v, want its error", err)
	}
}

// TestPeerFailedPushedReceive: on a node whose large messages are pushed
// (NoPull), a receive matched to rank 1's message waits in e.pushes for
// rank 1's data frames. If rank 1's ring is then found corrupt those can
// never come, yet PeerFailed leaves the receive waiting until its context
// ends.
func TestPeerFailedPushedReceive(t *testing.T) {
	noPull = true
	w := world(t, 2, nil)
	noPull = false
	if _, err := w[1].Isend(make([]byte, 1<<20), 0, 8); err != nil {
		t.Fatal(err)
	}
	r, err := w[0].Irecv(make([]byte, 1<<20), 1, 8)
	if err != nil {
		t.Fatal(err)
	}
	e := w[0].e
	deadline := time.Now().Add(time.Minute)
	for {
		w[0].Iprobe(AnySource, 999) // progress rank 0 only: rank 1 never pushes
		e.mu.Lock()
		n := len(e.pushes)
		e.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the receive was never waiting for a push")
		}
	}
	broken := errors.New("test: ring of rank 1 corrupt")
	failPeer(w[0], 1, broken)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := r.Wait(ctx); !errors.Is(err, broken) {
		t.Errorf("receive being pushed by the failed rank: %v, want its error", err)
	}
}

// failPeer tells c's engine, as a transport would, that world rank no
// longer reaches it (PeerFailed).
func failPeer(c *Comm, rank int, err error) {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	c.e.PeerFailed(rank, err)
}

// TestFreeAfterFailedCollective: rank 0's part of a Bcast on a duplicate
// fails (its context has ended) while the root's goes on and sends it the
// data, small and large. Rank 0 can still free the communicator: the
// messages no call can take are dropped, and the root's large send, which
// waited for rank 0 to take it, completes. Free refused ("messages on the
// communicator not received") and the root's Bcast waited for good.
func TestFreeAfterFailedCollective(t *testing.T) {
	for _, size := range []int{16, 1 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			w := world(t, 2, nil)
			var dups [2]*Comm
			each(t, w, func(ctx context.Context, c *Comm) error {
				d, err := c.Dup(ctx)
				dups[c.Rank()] = d
				return err
			})
			failed := make(chan struct{})
			each(t, w, func(ctx context.Context, c *Comm) error {
				d := dups[c.Rank()]
				buf := make([]byte, size)
				if c.Rank() == 1 {
					select {
					case <-failed: // the root sends once rank 0's part has failed
					case <-ctx.Done():
						return ctx.Err()
					}
					if err := d.Bcast(ctx, buf, 1); err != nil { // completes once rank 0 frees d
						return err
					}
					if err := d.Free(); err != nil {
						return err
					}
					return c.Barrier(ctx)
				}
				gone, cancel := context.WithCancel(ctx)
				cancel()
				err := d.Bcast(gone, buf, 1)
				close(failed)
				if err == nil {
					return errors.New("bcast with an ended context succeeded")
				}
				// Wait until the root's message is here, unreceived.
				e := c.e
				for {
					c.Iprobe(AnySource, 99)
					e.mu.Lock()
					n := len(e.unexpected[d.ctx|collBit])
					e.mu.Unlock()
					if n > 0 {
						break
					}
					if err := ctx.Err(); err != nil {
						return err
					}
				}
				if err := d.Free(); err != nil {
					return fmt.Errorf("free after a failed collective: %w", err)
				}
				// Progress on, for the root's finish frame to go out.
				return c.Barrier(ctx)
			})
		})
	}
}

// TestPeerFailedAnySource: a receive from any source waits on while one
// rank of the communicator has failed, for the others may still send, and
// fails once every other rank has, with the error of the first to fail
// (whichever rank it was): a posted one, a later one, and a probe.
// Before, they waited until their context ended.
func TestPeerFailedAnySource(t *testing.T) {
	for _, order := range [][2]int{{1, 2}, {2, 1}} {
		t.Run(fmt.Sprintf("%d-then-%d", order[0], order[1]), func(t *testing.T) {
			w := world(t, 3, nil)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			anyone, err := w[0].Irecv(make([]byte, 8), AnySource, 7)
			if err != nil {
				t.Fatal(err)
			}
			first := fmt.Errorf("test: rank %d gone first", order[0])
			failPeer(w[0], order[0], first)
			if done, _, err := anyone.Test(); done {
				t.Fatalf("a receive from any source completed (%v) with rank %d still there", err, order[1])
			}
			failPeer(w[0], order[1], fmt.Errorf("test: rank %d gone second", order[1]))
			if _, err := anyone.Wait(ctx); !errors.Is(err, first) {
				t.Fatalf("receive from any source once every other rank failed: %v, want the first failure", err)
			}
			if _, err := w[0].Irecv(make([]byte, 8), AnySource, 7); !errors.Is(err, first) {
				t.Fatalf("a later receive from any source: %v, want the first failure", err)
			}
			pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
			defer pcancel()
			if _, err := w[0].Probe(pctx, AnySource, AnyTag); !errors.Is(err, first) {
				t.Fatalf("a probe of any source: %v, want the first failure", err)
			}
		})
	}
}

// TestNegativeEagerLimit: with a negative Config.EagerLimit (no message
// goes eagerly) an empty message still goes, where large messages are
// pushed through the rings (NoPull). It went by rendezvous, and a pushed
// message of no bytes took no data frame, the one whose arrival finishes
// the receive: receive and send waited for good.
func TestNegativeEagerLimit(t *testing.T) {
	noPull = true
	defer func() { noPull = false }()
	comms := worldOn(t, 2, layout{name: "OneNode", eager: -1})
	each(t, comms, func(ctx context.Context, c *Comm) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		// Not Recv: a receive that has matched is waited for whatever
		// its context.
		var r *Request
		var err error
		if c.Rank() == 0 {
			r, err = c.Isend(nil, 1, 0)
		} else {
			r, err = c.Irecv(nil, 0, 0)
		}
		if err != nil {
			return err
		}
		if _, err := r.Wait(ctx); err != nil {
			return fmt.Errorf("a message of no bytes: %w", err)
		}
		buf := pattern(c.Rank(), 100)
		if err := c.Bcast(ctx, buf, 0); err != nil || !bytes.Equal(buf, pattern(0, 100)) {
			return fmt.Errorf("bcast of 100 bytes by rendezvous: %w", err)
		}
		return c.Barrier(ctx)
	})
}
