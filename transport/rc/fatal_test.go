package rc

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/transport/internal/transporttest"
	"github.com/xrcrun/xrc/verbs"
)

// TestDeviceFatal: a rank whose device goes away (IBV_EVENT_DEVICE_FATAL)
// reports every peer failed, once, with an error wrapping the event, even
// with no work of its own in flight to fail; later calls toward them fail.
// Before, the event was only logged: a receive posted for a peer waited for
// ever.
func TestDeviceFatal(t *testing.T) {
	da := transporttest.Device(t, "rct", softhca.Config{UDP: true})
	a, err := da.Open(verbs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, b := newDevice(t, softhca.Faults{})
	_, c := newDevice(t, softhca.Faults{})
	ends := job(t, []*verbs.Context{a, b, c}, nil)
	stream(t, ends[:2], 10)
	rm, err := ends[1].Tr.Expose(make([]byte, 4096))
	if err != nil {
		t.Fatal(err)
	}
	if err := da.Close(); err != nil {
		t.Fatal(err)
	}
	e := ends[0]
	transporttest.AwaitFailed(t, e, 1, 2)
	if len(e.H.Failed) != 2 {
		t.Fatalf("rank 0 heard of failures %v; want ranks 1 and 2", e.H.Failed)
	}
	for _, peer := range []int{1, 2} {
		errs := e.H.Failed[peer]
		if len(errs) != 1 {
			t.Fatalf("rank %d reported %d times: %v", peer, len(errs), errs)
		}
		if !errors.Is(errs[0], verbs.EventDeviceFatal) || !strings.Contains(errs[0].Error(), fmt.Sprintf("rc: rank %d:", peer)) {
			t.Errorf("rank %d failed with %q; want it to name the rank and wrap %v", peer, errs[0], verbs.EventDeviceFatal)
		}
		if _, err := e.Tr.TrySend(peer, []byte("x")); !errors.Is(err, verbs.EventDeviceFatal) {
			t.Errorf("a send to rank %d after the device died: %v", peer, err)
		}
		if err := e.Tr.Read(peer, make([]byte, 10), rm, 6); peer == 1 && !errors.Is(err, verbs.EventDeviceFatal) {
			t.Errorf("a read from rank %d after the device died: %v", peer, err)
		}
	}
	// Nothing will complete: Arm arms nothing, and there is no descriptor
	// to sleep on.
	if err := e.Tr.Arm(); err != nil {
		t.Errorf("Arm on a dead device: %v", err)
	}
	if fd := e.Tr.WakeFD(); fd != -1 {
		t.Errorf("WakeFD on a dead device: %d", fd)
	}
	// The objects of the dead device are destroyed without error, and the
	// context closes.
	if err := e.Tr.Close(); err != nil {
		t.Errorf("close after the device died: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("close the context after the device died: %v", err)
	}
}
