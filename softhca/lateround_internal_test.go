package softhca

import (
	"sync"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca/roce"
)

// TestLateRoundCountersConsistent: whoever reads the counters (Each, in
// their order: late_rounds, then late_round_ns) while the engine counts a
// late round sees at least lateRound of late_round_ns for each late round
// it sees. The engine counted the round before its lateness, so a read in
// between saw a late round of no time at all.
func TestLateRoundCountersConsistent(t *testing.T) {
	e := &engine{d: &Device{}}
	const rounds = 20000
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Go(func() {
		defer close(done)
		for range rounds {
			e.rxStamp = time.Now().Add(-lateRound).UnixNano() // just late enough
			e.noteLateRound()
		}
	})
	torn := 0
	for {
		select {
		case <-done:
			wg.Wait()
			if torn > 0 {
				t.Fatalf("%d reads saw late rounds without their lateness", torn)
			}
			return
		default:
		}
		// In Each's order.
		n, ns := e.d.counters.LateRounds.Load(), e.d.counters.LateRoundNs.Load()
		if ns < n*uint64(lateRound) {
			torn++
		}
	}
}

// TestLateRoundOnFabric: a device on a fabric (or looping its own packets
// back) counts a round that ran 10 ms or more after a packet was handed to
// it as late, as a device on UDP does from the kernel's receive time: the
// lossless tests excuse a transport timeout that such a round explains,
// and with in-process devices nothing else told of one.
func TestLateRoundOnFabric(t *testing.T) {
	r := newRig(t)
	r.d.mu.Lock() // the engine's next round waits
	before := r.d.counters.LateRounds.Load()
	r.inject(func(p *roce.Packet) { p.Opcode, p.PSN, p.AckReq = roce.SendOnly, 0x1234, true }) // an RNR NAK answers it
	time.Sleep(2 * lateRound)
	r.d.mu.Unlock()
	waitFor(t, "a late round", func() bool { return r.d.counters.LateRounds.Load() > before })
	if ns := time.Duration(r.d.counters.LateRoundNs.Load()); ns < 2*lateRound {
		t.Errorf("a round 20 ms late counted %v late", ns)
	}
}
