package softhca_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
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
	seen []stall
}

// stall is one the watch saw: when it ended, and how long it was.
type stall struct {
	end time.Time
	d   time.Duration
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
					stalls.seen = append(stalls.seen, stall{time.Now(), over})
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
	for _, s := range stalls.seen {
		if s.end.After(since) {
			longest = max(longest, s.d)
		}
	}
	return longest
}

// lossless gathers, from the start of a stretch of a test, the evidence
// that excuses a transport timeout on a lossless link: the test process
// stalled (stallWatch), the kernel dropped datagrams for want of socket
// buffer, or a device answered late because its own process stalled
// (Counters.LateRounds), which the timer of its peer cannot tell from
// loss.
type lossless struct {
	start time.Time
	drops uint64
	late  func() map[string]uint64 // the late rounds so far of each device that answers, by name
	late0 map[string]uint64        // late's answer when the watch started
}

// watchLossless starts gathering; late reads the late rounds of the
// devices the stretch uses, by device: a device that goes away, or comes
// back with its counters from zero, must not make the sum go down.
func watchLossless(t testing.TB, late func() map[string]uint64) *lossless {
	watchStalls()
	return &lossless{start: time.Now(), drops: udpRcvbufErrors(t), late: late, late0: late()}
}

// lateSince returns the late rounds the devices counted since the watch
// started: of each device that answers now, those it counted since (all
// of them for one that was not there then).
func (w *lossless) lateSince() uint64 {
	var n uint64
	for name, v := range w.late() {
		if v > w.late0[name] {
			n += v - w.late0[name]
		}
	}
	return n
}

// excuse says what happened since the watch started that explains a
// transport timeout on a lossless link, or returns "" if nothing does.
func (w *lossless) excuse(t testing.TB) string {
	var why []string
	if s := stalledSince(w.start); s > 0 {
		why = append(why, fmt.Sprintf("the test process went unscheduled for %v", s))
	}
	if n := udpRcvbufErrors(t) - w.drops; n > 0 {
		why = append(why, fmt.Sprintf("the kernel dropped %d datagrams", n))
	}
	if n := w.lateSince(); n > 0 {
		why = append(why, fmt.Sprintf("devices answered %d times 10 ms or more late", n))
	}
	return strings.Join(why, "; ")
}

// dirLateRounds reads the late rounds of the device processes serving in
// dir that answer, by name.
func dirLateRounds(t testing.TB, dir string) map[string]uint64 {
	socks, err := filepath.Glob(filepath.Join(dir, "*.sock"))
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]uint64{}
	for _, p := range socks {
		name := strings.TrimSuffix(filepath.Base(p), ".sock")
		cs, err := softhca.QueryCounters(context.Background(), dir, name)
		if err != nil {
			continue // gone, or not a device
		}
		for _, c := range cs {
			if c.Name == "late_rounds" {
				n[name] = c.Value
			}
		}
	}
	return n
}
