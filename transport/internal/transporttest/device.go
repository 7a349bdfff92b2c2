// Package transporttest holds the test helpers of the transports of other
// nodes (transport/rc, transport/xrc, transport/internal/verbsx): soft HCAs
// for a test, a handler that records what Progress delivers, the ends of a
// test job and the loop that drives them, and the frames of test streams.
// Only tests import it.
package transporttest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

var devSeq atomic.Uint32

// Device starts an in-process soft HCA of cfg, named prefix and a number,
// and closes it when the test ends. With cfg.UDP it speaks RoCEv2 on UDP
// on a loopback address of its own (random addresses of 127.64.0.0/10
// until one is free, as softhca's tests do); else, on cfg.Fabric, its
// address is cfg.Addr or, if that is not set, one of 127.3.0.0/16 of its
// own.
func Device(t testing.TB, prefix string, cfg softhca.Config) *softhca.Device {
	t.Helper()
	d := start(t, prefix, cfg)
	t.Cleanup(func() { closeAll(t, d) })
	return d
}

// OpenDevice starts a soft HCA as Device does and opens it; when the test
// ends it closes the context, then the device.
func OpenDevice(t testing.TB, prefix string, cfg softhca.Config) (*softhca.Device, *verbs.Context) {
	t.Helper()
	d := start(t, prefix, cfg)
	c, err := d.Open(verbs.Config{})
	if err != nil {
		d.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll(t, c, d) })
	return d, c
}

func start(t testing.TB, prefix string, cfg softhca.Config) *softhca.Device {
	t.Helper()
	var err error
	for range 20 {
		n := devSeq.Add(1)
		cfg.Name = fmt.Sprintf("%s%d", prefix, n)
		switch {
		case cfg.UDP:
			cfg.Addr = netip.AddrFrom4([4]byte{127, 64 + byte(rand.IntN(64)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
		case !cfg.Addr.IsValid():
			cfg.Addr = netip.AddrFrom4([4]byte{127, 3, byte(n >> 8), byte(n)})
		}
		var d *softhca.Device
		if d, err = softhca.New(context.Background(), cfg); err == nil {
			return d
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	t.Fatal(err)
	return nil
}

// closeAll closes cs in order, reporting their errors to t.
func closeAll(t testing.TB, cs ...io.Closer) {
	for _, c := range cs {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}
}
