package softhca_test

import (
	"sync"
	"time"
)

// The tests that say no transport timer fires on a lossless link (67 ms at
// the suite's timeout of 14 and more) hold on a machine that runs them,
// not on one so loaded that a device's process goes unscheduled for tens
// of milliseconds: its peer's timer then fires on time for an answer
// that was never late on the link. stallWatch tells the two apart: a
// goroutine of the test process sleeps a millisecond at a time and keeps
// the times it woke more than stallEvidence late, which the tests read as
// the machine's stalls, excusing a timeout only when one came while they
// ran (and saying so in the log).

// stallEvidence is the least oversleep taken as a sign of a stalled
// machine.
const stallEvidence = 10 * time.Millisecond

var stalls struct {
	once sync.Once
	mu   sync.Mutex
	at   []time.Time     // when each stall ended
	d    []time.Duration // how long it was
}

// watchStalls starts the watch, once per test process.
func watchStalls() {
	stalls.once.Do(func() {
		go func() {
			for {
				t0 := time.Now()
				time.Sleep(time.Millisecond)
				if over := time.Since(t0) - time.Millisecond; over >= stallEvidence {
					stalls.mu.Lock()
					stalls.at, stalls.d = append(stalls.at, time.Now()), append(stalls.d, over)
					stalls.mu.Unlock()
				}
			}
		}()
	})
}

// stalledSince returns the longest stall that ended after since, or 0.
func stalledSince(since time.Time) time.Duration {
	stalls.mu.Lock()
	defer stalls.mu.Unlock()
	var longest time.Duration
	for i, at := range stalls.at {
		if at.After(since) {
			longest = max(longest, stalls.d[i])
		}
	}
	return longest
}
