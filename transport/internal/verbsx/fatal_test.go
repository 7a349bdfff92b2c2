package verbsx

import (
	"errors"
	"strings"
	"testing"

	"github.com/xrcrun/xrc/verbs"
)

// TestCQErrFailsEveryPeer: a CQ_ERR of the rank's CQ (WatchEvents hands
// it to devFailure, as DEVICE_FATAL) fails every peer, reported once with
// an error wrapping the event; later sends fail with it, and Arm arms
// nothing.
func TestCQErrFailsEveryPeer(t *testing.T) {
	a, _, pa, _ := rcPair(t, 8, true, true)
	a.Tr.devFailure(verbs.EventCQErr)
	for range 10 {
		if _, err := a.Tr.Progress(a.H); err != nil {
			t.Fatal(err)
		}
	}
	// Once applied, the cause stays: a later DEVICE_FATAL reports nothing
	// more.
	a.Tr.devFailure(verbs.EventDeviceFatal)
	for range 10 {
		if _, err := a.Tr.Progress(a.H); err != nil {
			t.Fatal(err)
		}
	}
	errs := a.H.Failed[pa.Rank]
	if len(a.H.Failed) != 1 || len(errs) != 1 || !errors.Is(errs[0], verbs.EventCQErr) || !strings.Contains(errs[0].Error(), "CQ failed") {
		t.Fatalf("failures heard: %v; want rank 1 once, with CQ_ERR", a.H.Failed)
	}
	if _, err := a.Tr.TrySend(1, []byte("x")); !errors.Is(err, verbs.EventCQErr) {
		t.Errorf("a send after CQ_ERR: %v", err)
	}
	if err := a.Tr.Arm(); err != nil || a.Tr.WakeFD() != -1 {
		t.Errorf("Arm after CQ_ERR: %v, WakeFD %d", err, a.Tr.WakeFD())
	}
}

// TestDeviceFatalReplacesCQErr: a DEVICE_FATAL that comes before Progress
// applied a CQ_ERR is the cause (a dying device's flushes may overrun the
// CQ before it reports itself gone).
func TestDeviceFatalReplacesCQErr(t *testing.T) {
	a, _, pa, _ := rcPair(t, 8, true, true)
	a.Tr.devFailure(verbs.EventCQErr)
	a.Tr.devFailure(verbs.EventDeviceFatal)
	for range 10 {
		if _, err := a.Tr.Progress(a.H); err != nil {
			t.Fatal(err)
		}
	}
	errs := a.H.Failed[pa.Rank]
	if len(a.H.Failed) != 1 || len(errs) != 1 || !errors.Is(errs[0], verbs.EventDeviceFatal) {
		t.Fatalf("failures heard: %v; want rank 1 once, with DEVICE_FATAL", a.H.Failed)
	}
}
