package softhca_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

var devSeq atomic.Uint32

// newDevice starts an in-process device on its own address.
func newDevice(t testing.TB, f *softhca.Fabric) *softhca.Device {
	t.Helper()
	n := devSeq.Add(1)
	d, err := softhca.New(context.Background(), softhca.Config{
		Name:   fmt.Sprintf("softt%d", n),
		Addr:   netip.AddrFrom4([4]byte{127, 1, byte(n >> 8), byte(n)}),
		Fabric: f,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
		// The fabric loses nothing, so only a test that talks to nobody
		// may see the transport timer fire.
		if n := d.Counters().AckTimeouts.Load(); n > 0 && !strings.HasSuffix(t.Name(), "RetryExceeded") {
			t.Errorf("%s: transport timer fired %d times on a lossless fabric", d.Name(), n)
		}
	})
	return d
}

func open(t testing.TB, d *softhca.Device) *verbs.Context {
	t.Helper()
	c, err := d.Open(verbs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// TestConformance runs the verbs suite on in-process software HCAs: both
// sides on one device (loopback), and two devices joined by a fabric.
func TestConformance(t *testing.T) {
	t.Run("OneDevice", func(t *testing.T) {
		verbstest.Run(t, verbstest.Env{Name: "in-process loopback", Open: func(t testing.TB) (a, b *verbs.Context) {
			d := newDevice(t, nil)
			return open(t, d), open(t, d)
		}})
	})
	t.Run("TwoDevices", func(t *testing.T) {
		verbstest.Run(t, verbstest.Env{Name: "in-process, two devices", Open: func(t testing.TB) (a, b *verbs.Context) {
			f := softhca.NewFabric()
			return open(t, newDevice(t, f)), open(t, newDevice(t, f))
		}})
	})
}
