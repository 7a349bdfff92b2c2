package softhca

import (
	"sync"
	"testing"
	"time"
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
