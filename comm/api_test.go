package comm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/xrcrun/xrc/bootstrap"
)

// TestNilOp: a reduction given a nil Op returns an error on every rank,
// as for the other bad arguments, instead of panicking in the rank's
// goroutine (or a worker's, for the non-blocking forms, which no recover
// of the caller's can catch); the calls after it still pair up.
func TestNilOp(t *testing.T) {
	comms := world(t, 2, nil)
	calls := map[string]func(ctx context.Context, c *Comm) error{
		"Reduce":    func(ctx context.Context, c *Comm) error { return Reduce(ctx, c, []int{1}, []int{0}, nil, 0) },
		"Allreduce": func(ctx context.Context, c *Comm) error { return Allreduce(ctx, c, []int{1}, []int{0}, nil) },
		"ReduceScatter": func(ctx context.Context, c *Comm) error {
			return ReduceScatter(ctx, c, []int{1, 2}, []int{0}, []int{1, 1}, nil)
		},
		"Scan":   func(ctx context.Context, c *Comm) error { return Scan(ctx, c, []int{1}, []int{0}, nil) },
		"Exscan": func(ctx context.Context, c *Comm) error { return Exscan(ctx, c, []int{1}, []int{0}, nil) },
		"Iallreduce": func(ctx context.Context, c *Comm) error {
			_, err := Iallreduce(ctx, c, []int{1}, []int{0}, nil).Wait(ctx)
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			each(t, comms, func(ctx context.Context, c *Comm) (err error) {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				if err := call(ctx, c); err == nil {
					return fmt.Errorf("%s with a nil op: no error", name)
				}
				return c.Barrier(ctx)
			})
		})
	}
}

// TestWaitContextLeavesRequest: a Wait whose context ends returns the
// context's error and leaves the receive posted, its buffer the
// request's: a later Wait gets the message (package doc, Wait). Two
// goroutines may wait for one request at once.
func TestWaitContextLeavesRequest(t *testing.T) {
	comms := world(t, 2, nil)
	ctx := context.Background()
	buf := make([]byte, 8)
	r, err := comms[1].Irecv(buf, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	_, err = r.Wait(tctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with a context that ended: %v, want DeadlineExceeded", err)
	}
	if done, _, _ := r.Test(); done {
		t.Fatal("the request completed when its Wait's context ended")
	}
	var wg sync.WaitGroup
	sts := make([]Status, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { sts[i], errs[i] = r.Wait(ctx) })
	}
	if err := comms[0].Send(ctx, []byte("late"), 1, 1); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil || sts[i].Count != 4 || string(buf[:4]) != "late" {
			t.Errorf("waiter %d: %+v, %v, buffer %q", i, sts[i], errs[i], buf[:4])
		}
	}
}

// TestNonblockingCollectiveContext: the context a non-blocking collective
// is started with bounds the collective, not only its start: cancelled
// after Ibarrier returns (as a deferred cancel would), it fails the
// barrier, which a Wait of a context that cannot end then reports.
func TestNonblockingCollectiveContext(t *testing.T) {
	comms := world(t, 2, nil)
	cctx, cancel := context.WithCancel(context.Background())
	r := comms[0].Ibarrier(cctx) // rank 1 never joins
	cancel()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if _, err := r.Wait(wctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Ibarrier whose context was cancelled: %v, want context.Canceled", err)
	}
}

// TestErrorsMatch: the errors the package doc names are matched by
// errors.Is through the wrapping of the calls that return them.
func TestErrorsMatch(t *testing.T) {
	comms := world(t, 2, nil)
	ctx := context.Background()
	each(t, comms, func(ctx context.Context, c *Comm) error {
		if c.Rank() == 0 {
			return c.Send(ctx, make([]byte, 100<<10), 1, 0) // rendezvous
		}
		_, err := c.Recv(ctx, make([]byte, 10), 0, 0)
		if !errors.Is(err, ErrTruncate) {
			return fmt.Errorf("truncated rendezvous receive: %v", err)
		}
		return nil
	})
	r, _ := comms[0].Irecv(nil, 1, 0)
	r.Cancel()
	if _, err := r.Wait(ctx); !errors.Is(err, ErrCanceled) {
		t.Errorf("cancelled receive: %v", err)
	}
	// A collective wraps its context's error.
	tctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	err := Allreduce(tctx, comms[0], []int{1}, []int{0}, Sum[int]) // rank 1 never joins
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Allreduce whose context ended: %v", err)
	}
}

// TestAbortErrorAs: once the job is aborted, a rank's calls fail with an
// error that errors.As matches with *bootstrap.AbortError, naming the
// rank that aborted.
func TestAbortErrorAs(t *testing.T) {
	comms := world(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := comms[1].boot.Abort(ctx, "test"); err != nil { // Abort, less its os.Exit
		t.Fatal(err)
	}
	_, err := comms[0].Recv(ctx, make([]byte, 1), 1, 0)
	var ae *bootstrap.AbortError
	if !errors.As(err, &ae) || ae.Rank != 1 {
		t.Errorf("Recv in an aborted job: %v, want a *bootstrap.AbortError of rank 1", err)
	}
	for _, c := range comms {
		c.Finalize(ctx) // fails: the job is gone
	}
}

// TestAbortEndsTestLoop: once the job is aborted, a request that nothing
// will complete ends a loop of Tests (and Testall) with the abort's
// error, and later calls that wait for nothing (Isend, Irecv, Iprobe)
// fail with it too, as Abort's doc says of every rank's pending and
// later calls. Test said "not done, no error" for good, and Isend and
// Iprobe succeeded.
func TestAbortEndsTestLoop(t *testing.T) {
	comms := world(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := comms[0]
	r, err := c.Irecv(make([]byte, 8), 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := comms[1].boot.Abort(ctx, "test"); err != nil { // Abort, less its os.Exit
		t.Fatal(err)
	}
	var ae *bootstrap.AbortError
	deadline := time.Now().Add(10 * time.Second)
	for {
		done, _, err := r.Test()
		if done {
			if !errors.As(err, &ae) || ae.Rank != 1 {
				t.Errorf("Test of a receive pending at the abort: %v, want a *bootstrap.AbortError of rank 1", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a receive pending at the abort: Test says not done, %v, 10 s after", err)
		}
		time.Sleep(time.Millisecond)
	}
	if !Testall(r) {
		t.Error("Testall of a request pending at the abort: false")
	}
	_, isendErr := c.Isend([]byte{1}, 1, 0)
	_, irecvErr := c.Irecv(make([]byte, 1), 1, 0)
	_, _, iprobeErr := c.Iprobe(AnySource, AnyTag)
	for what, err := range map[string]error{"Isend": isendErr, "Irecv": irecvErr, "Iprobe": iprobeErr} {
		if !errors.As(err, &ae) {
			t.Errorf("%s in an aborted job: %v, want a *bootstrap.AbortError", what, err)
		}
	}
	for _, c := range comms {
		c.Finalize(ctx) // fails: the job is gone
	}
}

// TestSendContextStillSends: a small Send whose context ends while its
// message waits for room in the receiver's buffers returns the context's
// error, but the message, copied, still goes (Send's doc).
func TestSendContextStillSends(t *testing.T) {
	comms := world(t, 2, nil)
	ctx := context.Background()
	var reqs []*Request
	for len(reqs) < 1<<16 {
		r, err := comms[0].Isend(make([]byte, 64), 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
		if !r.isDone() {
			break // the receiver's buffers are full: the next frames queue
		}
	}
	if reqs[len(reqs)-1].isDone() {
		t.Skip("the receiver's buffers never filled")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := comms[0].Send(cctx, []byte("last"), 1, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Send with a context that ended, its message queued: %v", err)
	}
	// Rank 0 progresses (its backlog goes out as rank 1 makes room) while
	// rank 1 receives.
	sent := make(chan error, 1)
	go func() { _, err := Waitall(ctx, reqs...); sent <- err }()
	buf := make([]byte, 64)
	for range reqs {
		if _, err := comms[1].Recv(ctx, buf, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	go comms[0].Barrier(ctx) // progress for the queued "last"
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := comms[1].Recv(tctx, buf, 0, 1)
	if err != nil || string(buf[:st.Count]) != "last" {
		t.Fatalf("the message of the Send whose context ended: %q, %v", buf[:st.Count], err)
	}
	if err := comms[1].Barrier(ctx); err != nil {
		t.Fatal(err)
	}
}
