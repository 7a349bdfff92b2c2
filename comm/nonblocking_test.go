package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"
)

// TestNonblockingCollectives starts collectives of every kind on 5 ranks
// of every layout without waiting, with a blocking one and point-to-point
// messages among them, then waits for them in an order that differs
// between ranks, and checks every result.
func TestNonblockingCollectives(t *testing.T) {
	onLayouts(t, func(t *testing.T, l layout) {
		comms := worldOn(t, 5, l)
		n := len(comms)
		const size = 20000 // rendezvous
		each(t, comms, func(ctx context.Context, c *Comm) error {
			me := c.Rank()
			var reqs []*Request
			checks := map[int]func() error{} // by index in reqs
			add := func(r *Request, check func() error) {
				checks[len(reqs)] = check
				reqs = append(reqs, r)
			}

			bc := make([]byte, size)
			if me == 2 {
				copy(bc, pattern(2, size))
			}
			add(c.Ibcast(ctx, bc, 2), func() error {
				if !bytes.Equal(bc, pattern(2, size)) {
					return errors.New("ibcast: wrong bytes")
				}
				return nil
			})

			send := make([]int64, size/8)
			for i := range send {
				send[i] = int64(i + 1000*me)
			}
			sum := make([]int64, len(send))
			add(Iallreduce(ctx, c, send, sum, Sum), func() error {
				for i, v := range sum {
					if want := int64(n*i + 1000*n*(n-1)/2); v != want {
						return fmt.Errorf("iallreduce: element %d is %d, want %d", i, v, want)
					}
				}
				return nil
			})

			if err := c.Barrier(ctx); err != nil {
				return err
			}

			block := func(from, to int) []byte { return pattern(from*10+to, (from+to)%3*size/2) }
			var a2aSend, a2aWant []byte
			sc, rc := make([]int, n), make([]int, n)
			for r := range n {
				a2aSend = append(a2aSend, block(me, r)...)
				a2aWant = append(a2aWant, block(r, me)...)
				sc[r], rc[r] = len(block(me, r)), len(block(r, me))
			}
			a2aRecv := make([]byte, len(a2aWant))
			add(c.Ialltoallv(ctx, a2aSend, sc, nil, a2aRecv, rc, nil), func() error {
				if !bytes.Equal(a2aRecv, a2aWant) {
					return errors.New("ialltoallv: wrong bytes")
				}
				return nil
			})

			// A point-to-point exchange around the ring, between the
			// collectives, in the user's context.
			ring := make([]byte, 100)
			if _, err := c.Sendrecv(ctx, pattern(me, 100), (me+1)%n, 3, ring, (me-1+n)%n, 3); err != nil {
				return err
			}
			if !bytes.Equal(ring, pattern((me-1+n)%n, 100)) {
				return errors.New("sendrecv among the collectives: wrong bytes")
			}

			var gathered []byte
			if me == 0 {
				gathered = make([]byte, n*size)
			}
			add(c.Igather(ctx, pattern(me, size), gathered, 0), func() error {
				for r := range n {
					if me == 0 && !bytes.Equal(gathered[r*size:(r+1)*size], pattern(r, size)) {
						return fmt.Errorf("igather: block %d wrong", r)
					}
				}
				return nil
			})

			scan := make([]int64, 3)
			add(Iexscan(ctx, c, []int64{int64(me), 1, 2}, scan, Sum), func() error {
				if want := []int64{int64(me * (me - 1) / 2), int64(me), int64(2 * me)}; me > 0 && !slices.Equal(scan, want) {
					return fmt.Errorf("iexscan: %v, want %v", scan, want)
				}
				return nil
			})

			add(c.Ibarrier(ctx), func() error { return nil })

			// Even ranks wait for all at once, odd ones one by one, the
			// last first.
			if me%2 == 0 {
				if _, err := Waitall(ctx, reqs...); err != nil {
					return err
				}
			} else {
				for i := len(reqs) - 1; i >= 0; i-- {
					if _, err := reqs[i].Wait(ctx); err != nil {
						return fmt.Errorf("request %d: %w", i, err)
					}
				}
			}
			for i := range reqs {
				if err := checks[i](); err != nil {
					return err
				}
				if reqs[i].Cancel() {
					return errors.New("a collective's request was canceled")
				}
			}
			return nil
		})
	})
}

// TestNonblockingProgress: a rank's Iallreduce returns before the others
// have started theirs; the rank then does nothing with comm, and still
// the others' blocking Allreduce finishes, which needs this rank to pull
// their vectors and take the result: the collective's worker progresses
// on its own. A large Iallreduce goes to the worker at once, a small one
// when the hand-off timer fires.
func TestNonblockingProgress(t *testing.T) {
	for _, elems := range []int{8, 5000} {
		t.Run(fmt.Sprint(elems*8), func(t *testing.T) { testNonblockingProgress(t, elems) })
	}
}

func testNonblockingProgress(t *testing.T, elems int) {
	comms := world(t, 3, nil)
	started := make(chan struct{})
	othersDone := make(chan struct{}, 2)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		send := make([]int64, elems)
		for i := range send {
			send[i] = int64(c.Rank() + 1)
		}
		recv := make([]int64, elems)
		if c.Rank() != 0 {
			select {
			case <-started:
			case <-ctx.Done():
				return fmt.Errorf("rank 0's Iallreduce did not return: %w", ctx.Err())
			}
			if err := Allreduce(ctx, c, send, recv, Sum); err != nil {
				return err
			}
			othersDone <- struct{}{}
		} else {
			r := Iallreduce(ctx, c, send, recv, Sum)
			close(started)
			for range 2 {
				select {
				case <-othersDone:
				case <-ctx.Done():
					return fmt.Errorf("the others' Allreduce did not finish while this rank computed: %w", ctx.Err())
				}
			}
			// Test, not Wait: it progresses once and reports.
			for {
				done, _, err := r.Test()
				if err != nil {
					return err
				}
				if done {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
		if recv[0] != 6 || recv[elems-1] != 6 {
			return fmt.Errorf("sum %d … %d, want 6", recv[0], recv[elems-1])
		}
		return nil
	})
}

// TestDeferredHandOff: with the hand-off timer out of the way, a small
// collective that rank 0 starts and does not Wait for with a context that
// cannot end goes to a worker when rank 0 tests it, waits for something
// else, waits for it in other ways, or finalizes. Rank 1's Barrier can
// end only then.
func TestDeferredHandOff(t *testing.T) {
	cases := map[string]func(ctx context.Context, c *Comm, r *Request) error{
		"test": func(ctx context.Context, c *Comm, r *Request) error {
			for {
				done, _, err := r.Test()
				if done || err != nil {
					return err
				}
				if ctx.Err() != nil {
					return fmt.Errorf("tested: %w", ctx.Err())
				}
				time.Sleep(100 * time.Microsecond)
			}
		},
		"testall": func(ctx context.Context, c *Comm, r *Request) error {
			for !Testall(r) {
				if ctx.Err() != nil {
					return fmt.Errorf("tested: %w", ctx.Err())
				}
				time.Sleep(100 * time.Microsecond)
			}
			_, err := r.Wait(ctx)
			return err
		},
		"waitany": func(ctx context.Context, c *Comm, r *Request) error {
			_, _, err := Waitany(ctx, r)
			return err
		},
		"wait that can end": func(ctx context.Context, c *Comm, r *Request) error {
			_, err := r.Wait(ctx)
			return err
		},
		"recv": func(ctx context.Context, c *Comm, r *Request) error {
			// Rank 1 sends only after its Barrier.
			if _, err := c.Recv(ctx, make([]byte, 1), 1, 0); err != nil {
				return err
			}
			_, err := r.Wait(ctx)
			return err
		},
		"finalize": func(ctx context.Context, c *Comm, r *Request) error {
			if err := c.Finalize(ctx); err != nil {
				return err
			}
			if !r.isDone() {
				return errors.New("finalized with the Ibarrier not done")
			}
			return nil
		},
	}
	for name, wait := range cases {
		t.Run(name, func(t *testing.T) {
			comms := world(t, 2, nil)
			for _, c := range comms {
				c.e.handOffDelay = time.Hour
			}
			each(t, comms, func(ctx context.Context, c *Comm) error {
				ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				if c.Rank() == 0 {
					return wait(ctx, c, c.Ibarrier(context.Background()))
				}
				if err := c.Barrier(ctx); err != nil {
					return fmt.Errorf("rank 0 never took its part: %w", err)
				}
				switch name {
				case "finalize":
					return c.Finalize(ctx)
				case "recv":
					return c.Send(ctx, []byte{1}, 0, 0)
				}
				return nil
			})
		})
	}
}

// TestNonblockingErrors: a root out of range completes the request at
// once with an error; a context that ends completes it with the
// context's error.
func TestNonblockingErrors(t *testing.T) {
	comms := world(t, 2, nil)
	c := comms[0]
	r := c.Ibcast(context.Background(), nil, 2)
	if done, _, err := r.Test(); !done || err == nil {
		t.Fatalf("ibcast from rank 2 of 2: done %v, %v", done, err)
	}
	if r := Ireduce(context.Background(), c, []int8{1}, nil, Sum, -1); r.isDone() == false {
		t.Fatal("ireduce to root -1 did not fail at once")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	// Rank 1 never joins.
	if _, err := c.Ibarrier(ctx).Wait(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ibarrier whose context ends: %v", err)
	}
}

// TestNonblockingWaitContext: a Wait whose context ends returns then,
// even when no worker had taken the collective yet, and the collective
// goes on: a later Wait gets its end.
func TestNonblockingWaitContext(t *testing.T) {
	comms := world(t, 2, nil)
	late := make(chan struct{})
	each(t, comms, func(ctx context.Context, c *Comm) error {
		if c.Rank() == 1 {
			select {
			case <-late:
			case <-ctx.Done():
				return ctx.Err()
			}
			return c.Barrier(ctx)
		}
		r := c.Ibarrier(context.Background())
		wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		if _, err := r.Wait(wctx); !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("wait whose context ends: %v", err)
		}
		close(late) // (on an error above, each ends rank 1's context)
		_, err := r.Wait(ctx)
		return err
	})
}

// TestNonblockingTestLoop: with one P, a rank that only calls Test on
// its Ibarrier still lets the barrier's worker run (Test yields), so the
// loop ends within far less than the 10 ms after which the runtime would
// preempt it.
func TestNonblockingTestLoop(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	comms := world(t, 2, nil)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		r := c.Ibarrier(ctx)
		for tests := 0; ; tests++ {
			done, _, err := r.Test()
			if err != nil {
				return err
			}
			if done {
				return nil
			}
			if tests > 1e6 {
				return errors.New("a million Tests and the Ibarrier has not ended")
			}
		}
	})
}
