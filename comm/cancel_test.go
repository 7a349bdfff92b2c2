package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestRecvContextEnds: a Recv whose context ends before a message comes
// returns the context's error and leaves nothing behind: the message sent
// later goes to the next Recv, and the first buffer is not written.
func TestRecvContextEnds(t *testing.T) {
	onLayouts(t, func(t *testing.T, l layout) {
		comms := worldOn(t, 2, l)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, size := range []int{5, 100000} { // eager, rendezvous
			first := make([]byte, size)
			short, stop := context.WithTimeout(ctx, 10*time.Millisecond)
			_, err := comms[1].Recv(short, first, 0, 7)
			stop()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%d bytes: Recv with no message: %v", size, err)
			}
			errc := make(chan error, 1)
			go func() { errc <- comms[0].Send(ctx, pattern(3, size), 1, 7) }()
			second := make([]byte, size)
			st, err := comms[1].Recv(ctx, second, 0, 7)
			if err != nil || st.Count != size || !bytes.Equal(second, pattern(3, size)) {
				t.Fatalf("%d bytes: the next Recv: %+v, %v", size, st, err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(first, make([]byte, size)) {
				t.Fatalf("%d bytes: the abandoned buffer was written", size)
			}
		}
	})
}

// TestCancel: Cancel takes back a receive no message has matched, and
// not one that has completed or a send.
func TestCancel(t *testing.T) {
	comms := world(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := comms[1].Irecv(make([]byte, 8), 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Cancel() {
		t.Fatal("Cancel of a posted receive: false")
	}
	if _, err := r.Wait(ctx); !errors.Is(err, ErrCanceled) {
		t.Fatalf("Wait after Cancel: %v", err)
	}
	if r.Cancel() {
		t.Fatal("a second Cancel: true")
	}
	s, err := comms[0].Isend([]byte("12345678"), 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	r, err = comms[1].Irecv(buf, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Waitall(ctx, s, r); err != nil {
		t.Fatal(err)
	}
	if s.Cancel() || r.Cancel() || string(buf) != "12345678" {
		t.Fatalf("Cancel of a completed send or receive: true, or %q received", buf)
	}
}

// TestConcurrentCalls: goroutines of one rank make blocking calls on one
// communicator at once, each in a tag of its own, so that one drives the
// progress that completes another's requests, which the blocking calls
// recycle. Rendezvous sends complete when the receiver's finish frame
// comes, often while their Sendrecv still waits for its receive and then
// finds the send done at once. Under -race this checks that completing a
// request touches it no more once its waiter may have it back.
func TestConcurrentCalls(t *testing.T) {
	comms := world(t, 2, nil)
	const goroutines, rounds, size = 4, 300, 20000
	each(t, comms, func(ctx context.Context, c *Comm) error {
		peer := 1 - c.Rank()
		errs := make(chan error, goroutines)
		for g := range goroutines {
			go func() {
				in := make([]byte, size)
				for i := range rounds {
					out := pattern(c.Rank()*1000+g*10+i%7, size)
					if _, err := c.Sendrecv(ctx, out, peer, g, in, peer, g); err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(in, pattern(peer*1000+g*10+i%7, size)) {
						errs <- fmt.Errorf("goroutine %d, round %d: wrong bytes", g, i)
						return
					}
				}
				errs <- nil
			}()
		}
		var all []error
		for range goroutines {
			all = append(all, <-errs)
		}
		return errors.Join(all...)
	})
}
