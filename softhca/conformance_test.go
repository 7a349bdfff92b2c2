package softhca_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/xrcrun/xrc/mlx4"
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
	return cleanup(t, d, true)
}

// newUDPDevice starts an in-process device that speaks RoCEv2 on UDP, on a
// loopback address of its own: it tries random addresses of 127.64.0.0/10
// until one is free, so that test processes running at once do not clash.
func newUDPDevice(t testing.TB, cfg softhca.Config) *softhca.Device {
	t.Helper()
	var err error
	for range 20 {
		n := devSeq.Add(1)
		cfg.Name = fmt.Sprintf("softu%d", n)
		cfg.Addr = netip.AddrFrom4([4]byte{127, 64 + byte(rand.IntN(64)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
		cfg.UDP = true
		var d *softhca.Device
		if d, err = softhca.New(context.Background(), cfg); err == nil {
			return cleanup(t, d, cfg.Faults == softhca.Faults{})
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	t.Fatal(err)
	return nil
}

// cleanup closes d at the end of the test. On a lossless link, only a
// test that talks to nobody may see the transport timer fire. Benchmarks
// are exempt: they fill socket buffers, and a kernel drops datagrams when
// a receiver falls behind. So are tests during which the machine stalled
// this process or one of its devices (lossless).
func cleanup(t testing.TB, d *softhca.Device, lossless bool) *softhca.Device {
	inprocDevices.mu.Lock()
	inprocDevices.all = append(inprocDevices.all, d)
	inprocDevices.mu.Unlock()
	w := watchLossless(t, inprocLateRounds)
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
		// Timeouts handled late tell of a stalled test process, not of
		// loss.
		n := d.Counters().AckTimeouts.Load() - d.Counters().LateTimeouts.Load()
		if !lossless || isBenchmark(t) || n == 0 || strings.HasSuffix(t.Name(), "RetryExceeded") {
			return
		}
		if why := w.excuse(t); why != "" {
			t.Logf("%s: transport timer fired %d times; meanwhile %s", d.Name(), n, why)
			return
		}
		t.Errorf("%s: transport timer fired %d times on a lossless fabric", d.Name(), n)
	})
	return d
}

// inprocDevices are the devices the tests of this process made (cleanup).
var inprocDevices struct {
	mu  sync.Mutex
	all []*softhca.Device
}

// inprocLateRounds reads the late rounds of every device of this process,
// by its place in inprocDevices: a device's late answers time out its
// peers' requests.
func inprocLateRounds() map[string]uint64 {
	inprocDevices.mu.Lock()
	defer inprocDevices.mu.Unlock()
	n := make(map[string]uint64, len(inprocDevices.all))
	for i, d := range inprocDevices.all {
		n[strconv.Itoa(i)] = d.Counters().LateRounds.Load()
	}
	return n
}

// udpRcvbufErrors is the kernel's count of UDP datagrams dropped for want
// of receive buffer space (/proc/net/snmp, Udp RcvbufErrors).
func udpRcvbufErrors(t testing.TB) uint64 {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, name := range names {
			if name == "RcvbufErrors" && i < len(f) {
				v, err := strconv.ParseUint(f[i], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
		}
	}
	t.Fatal("no Udp RcvbufErrors in /proc/net/snmp")
	return 0
}

func open(t testing.TB, d *softhca.Device) *verbs.Context {
	t.Helper()
	c, err := d.Open(verbs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return closedAtEnd(t, c)
}

// closedAtEnd closes c when t ends, and returns it.
func closedAtEnd(t testing.TB, c *verbs.Context) *verbs.Context {
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// hardwareKernel hides the kernel's mlx4.Packer: the provider lays out its
// queues as for a ConnectX-3, each on pages of its own, with headroom slots
// stamped against prefetch.
type hardwareKernel struct{ mlx4.Kernel }

// openUnpacked opens d as open does, with queues laid out as for hardware.
func openUnpacked(t testing.TB, d *softhca.Device) *verbs.Context {
	t.Helper()
	k, err := d.Kernel()
	if err != nil {
		t.Fatal(err)
	}
	p, err := mlx4.Open(hardwareKernel{k})
	if err != nil {
		k.Close()
		t.Fatal(err)
	}
	return closedAtEnd(t, verbs.NewContext(d.Name(), p, verbs.Config{}))
}

// TestConformance runs the verbs suite on in-process software HCAs: both
// sides on one device (loopback), and two devices joined by a fabric, with
// the provider's queues packed (mlx4.Packer) and, once, laid out as for
// hardware.
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
	t.Run("TwoDevices/HardwareLayout", func(t *testing.T) {
		verbstest.Run(t, verbstest.Env{Name: "in-process, two devices, queues as for hardware", Open: func(t testing.TB) (a, b *verbs.Context) {
			f := softhca.NewFabric()
			return openUnpacked(t, newDevice(t, f)), openUnpacked(t, newDevice(t, f))
		}})
	})
	t.Run("UDP/OneDevice", func(t *testing.T) {
		verbstest.Run(t, verbstest.Env{Name: "in-process loopback over UDP", Open: func(t testing.TB) (a, b *verbs.Context) {
			d := newUDPDevice(t, softhca.Config{})
			return open(t, d), open(t, d)
		}})
	})
	t.Run("UDP/TwoDevices", func(t *testing.T) {
		verbstest.Run(t, verbstest.Env{Name: "in-process, two devices over UDP", Open: func(t testing.TB) (a, b *verbs.Context) {
			return open(t, newUDPDevice(t, softhca.Config{})), open(t, newUDPDevice(t, softhca.Config{}))
		}})
	})
}

// isBenchmark reports whether t is a benchmark's.
func isBenchmark(t testing.TB) bool {
	_, ok := t.(*testing.B)
	return ok
}

// TestPackedQueues: through a software HCA the provider keeps no headroom
// slots in a send queue (mlx4.Packer), so a QP asked for 4 send WRs gets 4
// slots; laid out as for hardware it gets the 2 KiB of headroom as well and
// takes up to 31.
func TestPackedQueues(t *testing.T) {
	f := softhca.NewFabric()
	for _, v := range []struct {
		name string
		open func(testing.TB, *softhca.Device) *verbs.Context
		want uint32
	}{{"packed", open, 4}, {"hardware layout", openUnpacked, 31}} {
		c := v.open(t, newDevice(t, f))
		pd, err := c.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		defer pd.Close()
		cq, err := c.CreateCQ(16, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer cq.Close()
		qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: cq, RecvCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		defer qp.Close()
		if got := qp.Cap().MaxSendWR; got != v.want {
			t.Errorf("%s: a QP asked for 4 send WRs takes %d, want %d", v.name, got, v.want)
		}
	}
}
