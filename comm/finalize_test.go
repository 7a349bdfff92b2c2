package comm

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// finalized reports whether c's rank has finalized.
func finalized(c *Comm) bool {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	return c.e.closed
}

// TestFinalize: the calls of a rank still waiting when it finalizes (a
// receive nobody answers, a non-blocking barrier another rank never
// joins) fail with ErrFinalized, and so do later calls, instead of
// reading the transports' memory once it is unmapped.
func TestFinalize(t *testing.T) {
	onLayouts(t, func(t *testing.T, l layout) {
		comms := worldOn(t, 2, l)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := comms[0]
		recvErr := make(chan error, 1)
		go func() {
			_, err := c.Recv(ctx, make([]byte, 8), 1, 99)
			recvErr <- err
		}()
		ib := c.Ibarrier(ctx)
		each(t, comms, func(ctx context.Context, c *Comm) error { return c.Finalize(ctx) })
		if err := <-recvErr; !errors.Is(err, ErrFinalized) {
			t.Errorf("a receive waiting at Finalize: %v", err)
		}
		if _, err := ib.Wait(ctx); !errors.Is(err, ErrFinalized) {
			t.Errorf("an ibarrier waiting at Finalize: %v", err)
		}
		_, recvAfter := c.Recv(ctx, nil, 1, 0)
		_, isendAfter := c.Isend(nil, 1, 0)
		_, _, iprobeAfter := c.Iprobe(AnySource, AnyTag)
		for what, err := range map[string]error{
			"Send":      c.Send(ctx, []byte{1}, 1, 0),
			"Recv":      recvAfter,
			"Isend":     isendAfter,
			"Iprobe":    iprobeAfter,
			"Barrier":   c.Barrier(ctx),
			"Allreduce": Allreduce(ctx, c, []int32{1}, make([]int32, 1), Sum),
			"Finalize":  c.Finalize(ctx),
		} {
			if !errors.Is(err, ErrFinalized) {
				t.Errorf("%s after Finalize: %v", what, err)
			}
		}
	})
}

// TestFinalizePending: requests still pending when their rank finalizes
// complete with ErrFinalized, so that Test and Testall report them done;
// a second Finalize, even at once from another goroutine, fails with
// ErrFinalized and takes no part in the job's barrier.
func TestFinalizePending(t *testing.T) {
	comms := world(t, 2, nil)
	c := comms[0]
	recv, err := c.Irecv(make([]byte, 8), 1, 7)
	if err != nil {
		t.Fatal(err)
	}
	send, err := c.Isend(make([]byte, 100000), 1, 8) // rendezvous: never pulled
	if err != nil {
		t.Fatal(err)
	}
	twice := make(chan error, 1)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		if c.Rank() == 0 {
			go func() { twice <- c.Finalize(ctx) }()
		}
		err := c.Finalize(ctx)
		if c.Rank() == 0 {
			// One of the two calls finalizes, the other fails.
			other := <-twice
			if (err == nil) == (other == nil) || !errors.Is(errors.Join(err, other), ErrFinalized) {
				return fmt.Errorf("two Finalizes: %v and %v", err, other)
			}
			return nil
		}
		return err
	})
	for name, r := range map[string]*Request{"irecv": recv, "isend": send} {
		done, _, err := r.Test()
		if !done || !errors.Is(err, ErrFinalized) {
			t.Errorf("%s pending at Finalize: Test says %v, %v", name, done, err)
		}
	}
	if !Testall(recv, send) {
		t.Error("Testall of the pending requests: false")
	}
}
