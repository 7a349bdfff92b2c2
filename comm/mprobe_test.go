package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
)

// TestMprobe: goroutines of one rank probe and receive at once, each
// sizing its buffer from its message's status; every message, eager or
// rendezvous, is received once and whole. A message taken by Mprobe is
// not matched by a receive posted later.
func TestMprobe(t *testing.T) {
	onLayouts(t, func(t *testing.T, l layout) {
		comms := worldOn(t, 2, l)
		const msgs, goroutines = 24, 4
		size := func(i int) int { return []int{0, 13, 20000}[i%3] }
		each(t, comms, func(ctx context.Context, c *Comm) error {
			if c.Rank() == 1 {
				for i := range msgs {
					if err := c.Send(ctx, pattern(i, size(i)), 0, i); err != nil {
						return err
					}
				}
				return c.Send(ctx, []byte("last"), 0, 99)
			}
			if msg, err := c.Improbe(1, 1000); msg != nil || err != nil {
				return fmt.Errorf("improbe of nothing: %v, %v", msg, err)
			}
			var mu sync.Mutex
			got := map[int]int{}
			var wg sync.WaitGroup
			errs := make([]error, goroutines)
			for g := range goroutines {
				wg.Go(func() {
					for range msgs / goroutines {
						msg, err := c.Mprobe(ctx, 1, AnyTag)
						if err == nil && msg.Status().Tag == 99 {
							err = errors.New("the last message came before the others")
						}
						if err != nil {
							errs[g] = err
							return
						}
						buf := make([]byte, msg.Status().Count)
						st, err := msg.Recv(ctx, buf)
						if err == nil && (st.Tag != msg.Status().Tag || !bytes.Equal(buf, pattern(st.Tag, size(st.Tag)))) {
							err = fmt.Errorf("message %d: wrong bytes or status %+v", msg.Status().Tag, st)
						}
						if err == nil {
							_, err = msg.Irecv(buf)
							if err == nil {
								err = errors.New("a message received twice")
							} else {
								err = nil
							}
						}
						if err != nil {
							errs[g] = err
							return
						}
						mu.Lock()
						got[st.Tag]++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				return err
			}
			for i := range msgs {
				if got[i] != 1 {
					return fmt.Errorf("message %d received %d times", i, got[i])
				}
			}
			msg, err := c.Mprobe(ctx, AnySource, 99)
			if err != nil {
				return err
			}
			r, err := c.Irecv(make([]byte, 4), AnySource, AnyTag)
			if err != nil {
				return err
			}
			if done, _, _ := r.Test(); done {
				return errors.New("a receive matched a message Mprobe took")
			}
			if !r.Cancel() {
				return errors.New("the receive could not be canceled")
			}
			buf := make([]byte, 2)
			if _, err := msg.Recv(ctx, buf); !errors.Is(err, ErrTruncate) || string(buf) != "la" {
				return fmt.Errorf("a message of 4 bytes into 2: %q, %v", buf, err)
			}
			return nil
		})
	})
}

// TestProbeBadArguments: probes of a rank or tag out of range fail at
// once instead of waiting for a message that cannot come.
func TestProbeBadArguments(t *testing.T) {
	c := world(t, 2, nil)[0]
	ctx := context.Background()
	_, probeErr := c.Probe(ctx, 2, 0)
	_, _, iprobeErr := c.Iprobe(0, -5)
	_, mprobeErr := c.Mprobe(ctx, -3, 0)
	_, improbeErr := c.Improbe(0, 1<<31)
	for what, err := range map[string]error{"Probe": probeErr, "Iprobe": iprobeErr, "Mprobe": mprobeErr, "Improbe": improbeErr} {
		if err == nil {
			t.Errorf("%s with a bad rank or tag: no error", what)
		}
	}
}
