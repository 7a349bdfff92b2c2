package rc

import (
	"sync"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/transport/internal/transporttest"
	"github.com/xrcrun/xrc/verbs"
)

// replier answers every frame from Deliver, as a handler may, and then
// takes a while before the next one (copying, matching).
type replier struct {
	t   *testing.T
	tr  *Transport
	got int
}

func (r *replier) Deliver(rank int, f []byte) {
	r.got++
	if _, err := r.tr.TrySend(rank, []byte{1}); err != nil {
		r.t.Error(err)
	}
	time.Sleep(2 * time.Millisecond)
}

func (r *replier) ReadDone(uint64, error) {}

// TestCreditsAfterRepost: a frame's credit goes back to its sender once
// its receive buffer is posted again, not when it is delivered. The reply
// a handler sends from Deliver carried the credit of the frame being
// delivered, and of those before it in the same poll, whose buffers were
// posted only after the poll: a sender within its credits ran the SRQ dry,
// and the receiver sent RNR NAKs with one peer.
func TestCreditsAfterRepost(t *testing.T) {
	da, a := newDevice(t, softhca.Faults{})
	db, b := newDevice(t, softhca.Faults{})
	ends := job(t, []*verbs.Context{a, b}, func(c *Config) { c.SRQDepth = 16 })
	const total = 60
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() { // rank 0 sends as fast as its credits let it
		h := transporttest.NewHandler()
		for sent := 0; ; {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := ends[0].Tr.Progress(h); err != nil {
				t.Error(err)
				return
			}
			if sent < total {
				ok, err := ends[0].Tr.TrySend(1, make([]byte, 200))
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					sent++
				}
			}
		}
	})
	time.Sleep(20 * time.Millisecond) // rank 0 uses its credits
	r := &replier{t: t, tr: ends[1].Tr}
	for deadline := time.Now().Add(time.Minute); r.got < total && time.Now().Before(deadline); {
		if _, err := ends[1].Tr.Progress(r); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if r.got != total {
		t.Fatalf("%d of %d frames arrived", r.got, total)
	}
	for _, d := range []*softhca.Device{da, db} {
		if n := d.Counters().RNRNaksSent.Load(); n > 0 {
			t.Errorf("%s: %d RNR NAKs with one peer within its credits", d.Name(), n)
		}
	}
}
