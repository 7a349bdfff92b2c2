package verbsx

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

var devSeq atomic.Uint32

// newDevice starts an in-process soft HCA on a fabric of its own and
// opens it.
func newDevice(t testing.TB, faults softhca.Faults) (*softhca.Device, *verbs.Context) {
	t.Helper()
	n := devSeq.Add(1)
	d, err := softhca.New(context.Background(), softhca.Config{Name: fmt.Sprintf("vx%d", n), Faults: faults,
		Fabric: softhca.NewFabric(), Addr: netip.AddrFrom4([4]byte{127, 2, byte(n >> 8), byte(n)})})
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Open(verbs.Config{})
	if err != nil {
		d.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d, c
}
