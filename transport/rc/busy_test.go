package rc

import (
	"errors"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// TestLazyStarterBusy: rank 0 starts a lazy connection (a TrySend) and
// then computes for longer than the transport's retries last (about 3 s)
// without calling Progress. Rank 1 answers at once and its QP is up, but
// rank 0's stays in INIT until its next Progress: rank 1 must send nothing
// until rank 0 says its QP is up. It sent, its retries ran out, and it
// failed rank 0 for good.
func TestLazyStarterBusy(t *testing.T) {
	ends := lazyJob(t, 2)
	if ok, err := ends[0].Tr.TrySend(1, []byte("from 0")); ok || err != nil {
		t.Fatalf("the first TrySend: %v, %v; want false, connecting", ok, err)
	}
	sent := false
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(time.Millisecond) { // rank 0 is busy
		if _, err := ends[1].Tr.Progress(ends[1].H); err != nil {
			t.Fatal(err)
		}
		if !sent {
			ok, err := ends[1].Tr.TrySend(0, []byte("from 1"))
			if err != nil {
				t.Fatalf("rank 1: %v", err)
			}
			sent = ok
		}
	}
	if sent {
		t.Error("rank 1 sent before rank 0's QP was up")
	}
	sent0 := false
	progress(t, ends, func() bool {
		for r, s := range []*bool{&sent0, &sent} {
			if !*s {
				ok, err := ends[r].Tr.TrySend(1-r, []byte("from "+string(rune('0'+r))))
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
				*s = ok
			}
		}
		return len(ends[0].H.Frames[1]) == 1 && len(ends[1].H.Frames[0]) == 1
	})
}

// TestLazyRefusal: a rank that cannot bring its QP up for a peer's hello
// refuses it, and the peer's connection fails; it waited for a ready that
// would never come.
func TestLazyRefusal(t *testing.T) {
	ends := lazyJob(t, 2)
	ends[1].Tr.failBringUp = errors.New("no QP today")
	var err error
	progress(t, ends, func() bool {
		_, err = ends[0].Tr.TrySend(1, []byte("x"))
		return err != nil
	})
	if !strings.Contains(err.Error(), "could not bring its QP up") {
		t.Fatalf("rank 0's send: %v", err)
	}
	// Both ranks hear of it once, as a peer failed (PeerFailureHandler):
	// nothing will come through the connection.
	deadline := time.Now().Add(10 * time.Second)
	progress(t, ends, func() bool {
		return len(ends[0].H.Failed[1]) > 0 && len(ends[1].H.Failed[0]) > 0 || time.Now().After(deadline)
	})
	for range 100 {
		for _, e := range ends {
			if _, err := e.Tr.Progress(e.H); err != nil {
				t.Fatal(err)
			}
		}
	}
	for r, want := range []string{"could not bring its QP up", "no QP today"} {
		errs := ends[r].H.Failed[1-r]
		if len(ends[r].H.Failed) != 1 || len(errs) != 1 || !strings.Contains(errs[0].Error(), want) {
			t.Errorf("rank %d heard of failures %v; want rank %d once, %q", r, ends[r].H.Failed, 1-r, want)
		}
	}
}

// TestStrayRefusal: a refusal that does not name this rank's QP toward
// the sender (a copy of an old one, or a confused member of the job) is
// counted and dropped; the connection it would have failed carries on. A
// refusal names the QP of the hello it answers, which is this rank's.
func TestStrayRefusal(t *testing.T) {
	ends := lazyJob(t, 2)
	stream(t, ends, 10) // connected both ways
	qpn := ends[0].Tr.peers[1].conn.QP.Num()
	bad := func() float64 {
		var m dto.Metric
		if err := ends[0].Tr.m.Bad.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	before := bad()
	ends[1].Tr.lz.put(0, hello{kind: kindRefusal, rank: 1, qpn: qpn + 1})
	deadline := time.Now().Add(10 * time.Second)
	progress(t, ends, func() bool { return bad() > before || time.Now().After(deadline) })
	if got := bad() - before; got != 1 {
		t.Errorf("stray refusal: %v malformed counted, want 1", got)
	}
	if errs := ends[0].H.Failed; len(errs) != 0 {
		t.Fatalf("a stray refusal failed the connection: %v", errs)
	}
	stream(t, ends, 10) // still connected
}
