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

// TestLateTimeout checks that a transport timer the engine handles more
// than a timeout late (its process stalled) resends without spending a
// retry, at most retry_cnt times, while a timely one spends one.
func TestLateTimeout(t *testing.T) {
	d := &Device{clock: newRealClock()}
	d.eng = newEngine(d, 0, false, Faults{})
	e := d.eng
	t0 := time.Unix(1000, 0)
	q := &qp{state: qpstate.RTS, timeout: 12, retryCnt: 3} // 16.8 ms, above lateSlack
	q.req.heapIdx = -1
	q.req.start(q)
	q.req.q = []*swqe{{npkts: 1, sent: 1}}
	now := e.instant(t0)
	// fire sets the timer a timeout ahead (the timeout grows as retries
	// are spent) and runs the engine's timers late by late timeouts.
	fire := func(late float64) {
		t.Helper()
		rto := d.rto(q)
		e.setTimer(q, now.add(rto))
		now = now.add(rto + time.Duration(late*float64(rto)))
		if !e.fireTimers(now) {
			t.Fatal("the timer did not fire")
		}
	}
	check := func(what string, retries, late uint64) {
		t.Helper()
		c := &d.counters
		if q.state != qpstate.RTS || uint64(q.req.retries) != retries || c.LateTimeouts.Load() != late {
			t.Fatalf("%s: state %v, %d retries left, %d late timeouts; want RTS, %d and %d",
				what, q.state, q.req.retries, c.LateTimeouts.Load(), retries, late)
		}
	}
	fire(0)
	check("timely", 2, 0)
	fire(0.5)
	check("half a timeout late", 1, 0)
	if d.rto(q) <= lateSlack {
		t.Fatalf("timeout %v: not above lateSlack %v", d.rto(q), lateSlack)
	}
	fire(3)
	check("three timeouts late", 1, 1)
	fire(2)
	check("late again", 1, 2)
	fire(4)
	check("late a third time", 1, 3)
	// retry_cnt late ones in a row are forgiven; the next one counts.
	fire(5)
	check("late a fourth time", 0, 3)

	// With a short timeout, lateness within lateSlack (a Go timer's own
	// delay) is not a stall, though it is several timeouts.
	q = &qp{state: qpstate.RTS, timeout: 8, retryCnt: 3} // 1 ms
	q.req.heapIdx = -1
	q.req.start(q)
	q.req.q = []*swqe{{npkts: 1, sent: 1}}
	fire(float64(lateSlack-time.Millisecond) / float64(d.rto(q)))
	check("short timeout, late within lateSlack", 2, 3)
}

// TestBackoff checks the transport timer's doubling: each retry spent
// without progress doubles the timeout, up to 8 times it or 256 ms,
// whichever is more, so that a QP with 7 retries and a timeout of 1 ms
// waits 267 ms in all before RETRY_EXC_ERR, and one with comm's 67 ms
// waits 3.2 s, as before the 256 ms floor.
func TestBackoff(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		timeout uint8
		want    [8]time.Duration // rto with 0, 1, … 7 retries spent
		total   time.Duration
	}{
		{8, [8]time.Duration{1048576, 2097152, 4194304, 8388608, 16777216, 33554432, 67108864, 134217728}, 267386880},
		{12, [8]time.Duration{16777216, 33554432, 67108864, 134217728, 256 * ms, 256 * ms, 256 * ms, 256 * ms}, 1275658240},
		{14, [8]time.Duration{67108864, 134217728, 268435456, 536870912, 536870912, 536870912, 536870912, 536870912}, 3154116608},
		{17, [8]time.Duration{536870912, 1073741824, 2147483648, 4294967296, 4294967296, 4294967296, 4294967296, 4294967296}, 25232932864},
	} {
		q := &qp{timeout: c.timeout, retryCnt: 7}
		q.req.start(q)
		var total time.Duration
		for used, want := range c.want {
			q.req.retries = uint8(7 - used)
			if got := new(Device).rto(q); got != want {
				t.Errorf("timeout %d, %d retries spent: rto %v, want %v", c.timeout, used, got, want)
			}
			total += want
		}
		if total != c.total {
			t.Errorf("timeout %d: %v in all, want %v", c.timeout, total, c.total)
		}
	}
}
