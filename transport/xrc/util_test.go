package xrc

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/bootstrap/boottest"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/verbs"
)

var devSeq atomic.Uint32

// newDevice starts an in-process soft HCA: on fab, or, with fab nil,
// speaking RoCEv2 on UDP on a loopback address of its own (random
// addresses of 127.64.0.0/10 until one is free).
func newDevice(t testing.TB, fab *softhca.Fabric, faults softhca.Faults) *softhca.Device {
	t.Helper()
	var err error
	for range 20 {
		n := devSeq.Add(1)
		cfg := softhca.Config{Name: fmt.Sprintf("xrct%d", n), Faults: faults, Fabric: fab,
			Addr: netip.AddrFrom4([4]byte{127, 3, byte(n >> 8), byte(n)})}
		if fab == nil {
			cfg.UDP = true
			cfg.Addr = netip.AddrFrom4([4]byte{127, 64 + byte(mrand.IntN(64)), byte(mrand.IntN(256)), byte(1 + mrand.IntN(254))})
		}
		var d *softhca.Device
		if d, err = softhca.New(context.Background(), cfg); err == nil {
			t.Cleanup(func() {
				if err := d.Close(); err != nil {
					t.Error(err)
				}
				// Credits keep every sender within the receivers' buffers.
				if n := d.Counters().RNRNaksSent.Load(); n > 0 {
					t.Errorf("%s: %d RNR NAKs sent", d.Name(), n)
				}
			})
			return d
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	t.Fatal(err)
	return nil
}

// kicker lets a test wait for a kick.
type kicker struct{ ch chan struct{} }

func newKicker() *kicker { return &kicker{ch: make(chan struct{}, 1)} }

func (k *kicker) kick() {
	select {
	case k.ch <- struct{}{}:
	default:
	}
}

// handler records what Progress delivers.
type handler struct {
	frames map[int][][]byte
	reads  map[uint64]error
}

func newHandler() *handler { return &handler{frames: map[int][][]byte{}, reads: map[uint64]error{}} }

func (h *handler) Deliver(rank int, f []byte) {
	h.frames[rank] = append(h.frames[rank], append([]byte(nil), f...))
}

func (h *handler) ReadDone(cookie uint64, err error) { h.reads[cookie] = err }

// end is one rank of a test job: its transport and handler.
type end struct {
	tr *Transport
	h  *handler
	k  *kicker
}

// testJob is a job of ranks as goroutines: rank r on node nodes[r], each
// node a soft HCA, each rank with a verbs context of its own (as a
// process has) and the node's domain file.
type testJob struct {
	nodes []int
	devs  map[int]*softhca.Device
	ends  []*end
}

// job makes the devices and one transport per rank, and connects them
// through an exchange of their records, after mod changes their configs.
// With udp the nodes speak RoCEv2 on UDP (and faults apply).
func job(t testing.TB, nodes []int, udp bool, faults softhca.Faults, mod func(*Config)) *testJob {
	t.Helper()
	j := &testJob{nodes: nodes, devs: map[int]*softhca.Device{}}
	var fab *softhca.Fabric
	if !udp {
		fab = softhca.NewFabric()
	}
	dir := t.TempDir()
	for _, n := range nodes {
		if j.devs[n] == nil {
			j.devs[n] = newDevice(t, fab, faults)
		}
	}
	j.ends = make([]*end, len(nodes))
	for r, n := range nodes {
		c, err := j.devs[n].Open(verbs.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := c.Close(); err != nil {
				t.Error(err)
			}
		})
		k := newKicker()
		cfg := Config{Device: c, Rank: r, Nodes: nodes, Kick: k.kick,
			DomainFile: filepath.Join(dir, fmt.Sprintf("xrcd-%d", n))}
		if mod != nil {
			mod(&cfg)
		}
		tr, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := tr.Close(); err != nil {
				t.Error(err)
			}
		})
		j.ends[r] = &end{tr: tr, h: newHandler(), k: k}
	}
	peers := make([]transport.Peer, len(nodes))
	for r, e := range j.ends {
		peers[r] = transport.Peer{Rank: r, Node: nodes[r], Record: e.tr.Record()}
	}
	for _, e := range j.ends {
		if err := e.tr.Connect(context.Background(), peers); err != nil {
			t.Fatal(err)
		}
	}
	return j
}

// clients joins ranks, on the given nodes, to a rendezvous server of
// their own.
func clients(t *testing.T, nodes []int) []*bootstrap.Client { return boottest.Clients(t, nodes) }

// progress runs Progress on every end until cond holds. The deadline
// only guards against a hang.
func progress(t testing.TB, ends []*end, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for idle := 0; !cond(); {
		n := 0
		for _, e := range ends {
			k, err := e.tr.Progress(e.h)
			if err != nil {
				t.Fatal(err)
			}
			n += k
		}
		if n == 0 {
			idle++
			if idle%64 == 0 {
				select {
				case <-ends[idle/64%len(ends)].k.ch:
				case <-time.After(time.Millisecond):
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no progress for 3 minutes")
		}
	}
}

func pattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seed*131 + i*7 + i>>8)
	}
	return b
}
