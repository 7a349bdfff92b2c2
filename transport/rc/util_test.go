package rc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/verbs"
)

var devSeq atomic.Uint32

// newDevice starts an in-process soft HCA speaking RoCEv2 on UDP on a
// loopback address of its own (random addresses of 127.64.0.0/10 until
// one is free, as softhca's tests do), and opens it.
func newDevice(t testing.TB, faults softhca.Faults) (*softhca.Device, *verbs.Context) {
	t.Helper()
	var err error
	for range 20 {
		n := devSeq.Add(1)
		cfg := softhca.Config{Name: fmt.Sprintf("rct%d", n), UDP: true, Faults: faults,
			Addr: netip.AddrFrom4([4]byte{127, 64 + byte(rand.IntN(64)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})}
		var d *softhca.Device
		if d, err = softhca.New(context.Background(), cfg); err == nil {
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
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	t.Fatal(err)
	return nil, nil
}

// kicker counts kicks and lets a test wait for one.
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

// job makes one transport per context, rank i on node i, and connects
// them through an exchange of their records.
func job(t testing.TB, ctxs []*verbs.Context, mod func(*Config)) []*end {
	t.Helper()
	nodes := make([]int, len(ctxs))
	for i := range nodes {
		nodes[i] = i
	}
	ends := make([]*end, len(ctxs))
	for i, c := range ctxs {
		k := newKicker()
		cfg := Config{Device: c, Rank: i, Nodes: nodes, Kick: k.kick}
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
		ends[i] = &end{tr: tr, h: newHandler(), k: k}
	}
	peers := make([]transport.Peer, len(ctxs))
	for i, e := range ends {
		peers[i] = transport.Peer{Rank: i, Node: i, Record: e.tr.Record()}
	}
	for _, e := range ends {
		if err := e.tr.Connect(context.Background(), peers); err != nil {
			t.Fatal(err)
		}
	}
	return ends
}

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
				// Sleep until some end's completion kicks.
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
