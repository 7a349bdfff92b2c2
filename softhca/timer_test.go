package softhca

import (
	"testing"
	"time"

	"github.com/xrcrun/xrc/internal/qpstate"
)

// TestLazyTimers checks the requester timers' heap, which is updated
// lazily: a timer cancelled or moved later fires not at its old deadline,
// one moved earlier fires at the new one, and the heap keeps a QP at most
// once. The engine is not running and every time is given explicitly, so
// nothing here depends on how fast the machine is.
func TestLazyTimers(t *testing.T) {
	d := &Device{clock: newRealClock()}
	d.eng = newEngine(d, 0, false, Faults{})
	e := d.eng
	t0 := time.Unix(1000, 0)
	at := func(ms int) instant { return e.instant(t0.Add(time.Duration(ms) * time.Millisecond)) }
	newQP := func() *qp {
		q := &qp{state: qpstate.RTS}
		q.req.heapIdx = -1
		return q
	}
	// A QP whose timer ends an RNR wait: when it fires, the QP is
	// scheduled, which the test sees in the run queue.
	wait := func(q *qp) { q.req.rnrUntil = e.instant(t0) }
	fired := func(q *qp) bool {
		f := q.req.scheduled
		q.req.scheduled = false
		e.runq = e.runq[:0]
		return f
	}
	check := func(what string, got, want bool) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}

	// Moved later: nothing at the old deadline, the heap entry moves.
	a := newQP()
	wait(a)
	e.setTimer(a, at(10))
	e.setTimer(a, at(20))
	check("fired at the old deadline", e.fireTimers(at(15)) || fired(a), false)
	if len(e.timers) != 1 || a.req.heapAt != at(20) {
		t.Fatalf("after moving later: %d entries, queued at %v", len(e.timers), a.req.heapAt.sub(at(0)))
	}
	check("fired at the new deadline", e.fireTimers(at(20)) && fired(a), true)
	check("still queued after firing", len(e.timers) != 0 || a.req.timerAt != 0, false)

	// Cancelled: the entry is dropped when it comes up, without firing.
	wait(a)
	e.setTimer(a, at(30))
	e.setTimer(a, 0)
	check("cancelled timer fired", e.fireTimers(at(40)) || fired(a), false)
	check("cancelled timer still queued", len(e.timers) != 0, false)

	// Cancelled, then set again later than the queued entry: one entry,
	// firing at the later deadline only.
	wait(a)
	e.setTimer(a, at(50))
	e.setTimer(a, 0)
	e.setTimer(a, at(70))
	check("one entry", len(e.timers) == 1, true)
	check("fired before its deadline", e.fireTimers(at(60)) || fired(a), false)
	check("fired at its deadline", e.fireTimers(at(70)) && fired(a), true)

	// Moved earlier: the heap follows at once.
	b := newQP()
	wait(a)
	wait(b)
	e.setTimer(a, at(100))
	e.setTimer(b, at(90))
	e.setTimer(a, at(80))
	check("earlier timer queued first", e.timers[0] == a && a.req.heapAt == at(80), true)
	check("a fired at 80", e.fireTimers(at(80)) && fired(a) && !fired(b), true)
	check("b fired at 90", e.fireTimers(at(90)) && fired(b), true)

	// cancelTimer takes the QP out of the heap at once.
	e.setTimer(a, at(200))
	e.cancelTimer(a)
	check("cancelTimer left the QP queued", len(e.timers) != 0 || a.req.heapIdx != -1, false)
}
