package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/xrcrun/xrc/verbs"
)

// TestFree: a communicator in use cannot be freed (a receive posted, a
// message unreceived); once its calls are done, every rank frees it, the
// engine forgets its context, and later calls fail with ErrFreed, while
// the world goes on.
func TestFree(t *testing.T) {
	comms := world(t, 3, nil)
	each(t, comms, func(ctx context.Context, w *Comm) error {
		c, err := w.Dup(ctx)
		if err != nil {
			return err
		}
		sum := make([]int32, 1)
		if err := Allreduce(ctx, c, []int32{int32(w.Rank())}, sum, Sum); err != nil {
			return err
		}
		// A message from the rank before, received only after a failed Free.
		if err := c.Send(ctx, []byte{7}, (c.Rank()+1)%3, 5); err != nil {
			return err
		}
		if err := w.Barrier(ctx); err != nil { // every message has arrived
			return err
		}
		if err := c.Free(); err == nil {
			return errors.New("free with a message unreceived: no error")
		}
		buf := make([]byte, 1)
		if _, err := c.Recv(ctx, buf, (c.Rank()+2)%3, 5); err != nil {
			return err
		}
		r, err := c.Irecv(buf, AnySource, 6)
		if err != nil {
			return err
		}
		if err := c.Free(); err == nil {
			return errors.New("free with a receive posted: no error")
		}
		r.Cancel()
		if err := c.Barrier(ctx); err != nil { // the communicator still works
			return err
		}
		if err := c.Free(); err != nil {
			return err
		}
		w.e.mu.Lock()
		_, known := w.e.comms[c.ctx]
		_, posted := w.e.posted[c.ctx]
		_, collPosted := w.e.posted[c.ctx|collBit]
		w.e.mu.Unlock()
		if known || posted || collPosted {
			return fmt.Errorf("after Free the engine still has the context: %v %v %v", known, posted, collPosted)
		}
		_, isendErr := c.Isend(nil, 0, 0)
		for what, err := range map[string]error{
			"Send":      c.Send(ctx, nil, 0, 0),
			"Isend":     isendErr,
			"Barrier":   c.Barrier(ctx),
			"Allreduce": Allreduce(ctx, c, sum, sum, Sum),
			"Free":      c.Free(),
		} {
			if !errors.Is(err, ErrFreed) {
				return fmt.Errorf("%s on a freed communicator: %v", what, err)
			}
		}
		if w.Free() == nil {
			return errors.New("freeing the world: no error")
		}
		return w.Barrier(ctx)
	})
}

// TestFreeUnusedCollective: a communicator freed before its first
// collective refuses collectives too.
func TestFreeUnusedCollective(t *testing.T) {
	comms := world(t, 2, nil)
	each(t, comms, func(ctx context.Context, w *Comm) error {
		c, err := w.Split(ctx, 0, w.Rank())
		if err != nil {
			return err
		}
		if err := c.Free(); err != nil {
			return err
		}
		if err := c.Barrier(ctx); !errors.Is(err, ErrFreed) {
			return fmt.Errorf("barrier on a freed communicator: %v", err)
		}
		return nil
	})
}

// TestFreeReviewCases: a freed communicator of one rank refuses its
// collectives too (they would send nothing that could fail); Free refuses
// while a non-blocking collective on the communicator runs; a message
// Mprobe took before Free is still received after it.
func TestFreeReviewCases(t *testing.T) {
	comms := world(t, 2, nil)
	each(t, comms, func(ctx context.Context, w *Comm) error {
		one, err := w.Split(ctx, w.Rank(), 0)
		if err != nil {
			return err
		}
		if err := one.Free(); err != nil {
			return err
		}
		_, dupErr := one.Dup(ctx)
		_, ibErr := one.Ibarrier(ctx).Wait(ctx)
		for what, err := range map[string]error{"Barrier": one.Barrier(ctx), "Dup": dupErr, "Ibarrier": ibErr,
			"Allreduce": Allreduce(ctx, one, []int8{1}, make([]int8, 1), Sum)} {
			if !errors.Is(err, ErrFreed) {
				return fmt.Errorf("%s on a freed communicator of one rank: %v", what, err)
			}
		}

		c, err := w.Dup(ctx)
		if err != nil {
			return err
		}
		r := c.Ibarrier(ctx)
		if err := c.Free(); err == nil {
			return errors.New("free with an Ibarrier running: no error")
		}
		if _, err := r.Wait(ctx); err != nil {
			return err
		}
		if c.Rank() == 1 {
			for _, n := range []int{8, 100000} {
				if err := c.Send(ctx, pattern(n, n), 0, n); err != nil {
					return err
				}
			}
			return c.Free()
		}
		var msgs []*Message
		for _, n := range []int{8, 100000} {
			msg, err := c.Mprobe(ctx, 1, n)
			if err != nil {
				return err
			}
			msgs = append(msgs, msg)
		}
		// The rendezvous one is still only offered, its sender waiting.
		if err := c.Free(); err != nil {
			return err
		}
		for _, msg := range msgs {
			n := msg.Status().Count
			buf := make([]byte, n)
			if _, err := msg.Recv(ctx, buf); err != nil || !bytes.Equal(buf, pattern(n, n)) {
				return fmt.Errorf("a message taken before Free, %d bytes: %v", n, err)
			}
		}
		return nil
	})
}

// TestFreeAllocMemory: buffers from verbs.Alloc that a rendezvous moved
// between nodes can be freed once the transfer is done, while the job goes
// on. The transports keep unused registrations of them in their caches;
// before the caches hooked verbs.Free, it failed with EBUSY until Finalize.
func TestFreeAllocMemory(t *testing.T) {
	for _, l := range []layout{layouts[1], layouts[3]} {
		t.Run(l.name, func(t *testing.T) {
			comms := worldOn(t, 2, l)
			each(t, comms, func(ctx context.Context, c *Comm) error {
				buf, err := verbs.Alloc(1 << 20)
				if err != nil {
					return err
				}
				if c.Rank() == 0 {
					for i := range buf {
						buf[i] = byte(i * 7)
					}
					if err := c.Send(ctx, buf, 1, 3); err != nil {
						return err
					}
				} else {
					if _, err := c.Recv(ctx, buf, 0, 3); err != nil {
						return err
					}
					for i := range buf {
						if buf[i] != byte(i*7) {
							return fmt.Errorf("byte %d: %d, want %d", i, buf[i], byte(i*7))
						}
					}
				}
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				if err := verbs.Free(buf); err != nil {
					return fmt.Errorf("free after the transfer: %w", err)
				}
				return c.Barrier(ctx) // the job goes on
			})
		})
	}
}
