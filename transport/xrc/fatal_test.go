package xrc

import (
	"errors"
	"strings"
	"testing"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/transport/internal/transporttest"
	"github.com/xrcrun/xrc/verbs"
)

// TestDeviceFatal: the ranks of a node whose device goes away
// (IBV_EVENT_DEVICE_FATAL) report every rank of the other nodes failed,
// once, with an error wrapping the event, though no work of theirs was in
// flight; later calls toward them fail, and closing the transports and
// contexts on the dead device succeeds. Before, the event was only logged.
func TestDeviceFatal(t *testing.T) {
	j := job(t, twoByTwo, false, softhca.Faults{}, nil)
	ends := j.ends
	transporttest.OneWay(t, ends, 0, 1, 5)
	transporttest.OneWay(t, ends, 3, 2, 5)
	if err := j.devs[0].Close(); err != nil {
		t.Fatal(err)
	}
	dead := []int{0, 2} // the ranks of node 0
	for _, r := range dead {
		e := ends[r]
		transporttest.AwaitFailed(t, e, 1, 3)
		if len(e.H.Failed) != 2 {
			t.Fatalf("rank %d heard of failures %v; want ranks 1 and 3", r, e.H.Failed)
		}
		for _, peer := range []int{1, 3} {
			errs := e.H.Failed[peer]
			if len(errs) != 1 || !errors.Is(errs[0], verbs.EventDeviceFatal) || !strings.Contains(errs[0].Error(), "xrc: node 1:") {
				t.Errorf("rank %d heard of rank %d failing %v; want once, naming node 1 and wrapping %v", r, peer, errs, verbs.EventDeviceFatal)
			}
			if _, err := e.Tr.TrySend(peer, []byte("x")); !errors.Is(err, verbs.EventDeviceFatal) {
				t.Errorf("rank %d: a send to rank %d after the device died: %v", r, peer, err)
			}
		}
		if err := e.Tr.Arm(); err != nil {
			t.Errorf("rank %d: Arm on a dead device: %v", r, err)
		}
		if fd := e.Tr.WakeFD(); fd != -1 {
			t.Errorf("rank %d: WakeFD on a dead device: %d", r, fd)
		}
		if err := e.Tr.Close(); err != nil {
			t.Errorf("rank %d: close after the device died: %v", r, err)
		}
	}
}
