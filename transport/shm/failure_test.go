package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xrcrun/xrc/transport"
)

// connectNode makes the shm transports of n ranks of one node, each with
// the Config that cfg makes for its rank, and connects them to each other
// and to the peers of other nodes in others.
func connectNode(t *testing.T, n int, cfg func(rank int) Config, others ...transport.Peer) []*Transport {
	dir := t.TempDir()
	ts := make([]*Transport, n)
	peers := make([]transport.Peer, n, n+len(others))
	for i := range ts {
		c := cfg(i)
		c.Dir, c.JobID, c.Rank, c.LocalRank, c.LocalSize = dir, "j", i, i, n
		tr, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := tr.Close(); err != nil {
				t.Error(err)
			}
		})
		ts[i] = tr
		peers[i] = transport.Peer{Rank: i, Node: 0, LocalRank: i, Record: tr.Record()}
	}
	peers = append(peers, others...)
	for _, tr := range ts {
		if err := tr.Connect(context.Background(), peers); err != nil {
			t.Fatal(err)
		}
	}
	return ts
}

// counterValue is the value of the counter name that reg gathers, or -1
// if it has none.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return -1
}

// TestCorruptRingFailsOnlyItsPeer: of three ranks of a node, rank 1
// writes a good frame into rank 0's inbox and then a corrupt record (a
// frame longer than the ring allows); rank 2 sends after it. Rank 0 gets
// rank 1's good frame and every frame of rank 2, Progress does not fail,
// the inbox is not left Pending, the peer is counted and logged once, and
// sends to and reads from rank 1 fail with an error that wraps ErrCorrupt
// while rank 2 is still reached; the handler hears of rank 1 once
// (PeerFailed), so that it fails what waits for it. Before, Progress returned rank 1's error
// on every call, before it read rank 2's ring, and the inbox stayed
// Pending: rank 2 went unheard for good.
func TestCorruptRingFailsOnlyItsPeer(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	ts := connectNode(t, 3, func(rank int) Config {
		if rank != 0 {
			return Config{RingData: 4096}
		}
		return Config{RingData: 4096, Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	})
	send := func(from, to int, f []byte) {
		t.Helper()
		if ok, err := ts[from].TrySend(to, f); err != nil || !ok {
			t.Fatalf("rank %d: send to %d: %v, %v", from, to, ok, err)
		}
	}
	send(1, 0, []byte("good"))
	// The corrupt record: a header naming 100000 bytes, published.
	p := ts[1].out[0].ring
	binary.LittleEndian.PutUint64(p.data[p.pos&p.mask:], 100000)
	p.pos += 16
	p.tail.Store(p.pos)
	const msgs = 200 // more than rank 2's ring holds at once
	got := &collector{frames: map[int][][]byte{}, reads: map[uint64]error{}}
	sent := 0
	for round := 0; sent < msgs || len(got.frames[2]) < msgs; round++ {
		if round > 100*msgs {
			t.Fatalf("rank 0 got %d of rank 2's %d frames (%d sent)", len(got.frames[2]), msgs, sent)
		}
		for sent < msgs {
			ok, err := ts[2].TrySend(0, fmt.Appendf(nil, "from 2 #%d", sent))
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			sent++
		}
		if _, err := ts[0].Progress(got); err != nil {
			t.Fatalf("rank 0: progress: %v", err)
		}
	}
	for k, f := range got.frames[2] {
		if want := fmt.Sprintf("from 2 #%d", k); string(f) != want {
			t.Fatalf("rank 2's frame %d: %q, want %q", k, f, want)
		}
	}
	if fs := got.frames[1]; len(fs) != 1 || string(fs[0]) != "good" {
		t.Fatalf("rank 0 got %q from rank 1, want only its frame before the corrupt one", fs)
	}
	// What the broken peer writes afterwards is ignored, and does not keep
	// the inbox pending.
	if _, err := ts[1].TrySend(0, []byte("later")); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := ts[0].Progress(got); err != nil {
			t.Fatalf("rank 0: progress: %v", err)
		}
	}
	if len(got.frames[1]) != 1 {
		t.Fatalf("rank 0 got %d frames from the broken rank 1", len(got.frames[1]))
	}
	if ts[0].Bell().Pending() {
		t.Fatal("rank 0's inbox stays pending with rank 1's ring broken")
	}
	if _, err := ts[0].TrySend(1, []byte("x")); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("send to the broken rank 1: %v, want an error naming it that wraps ErrCorrupt", err)
	}
	r, err := ts[1].Expose(make([]byte, 64))
	if err != nil {
		t.Fatal(err)
	}
	if err := ts[0].Read(1, make([]byte, 64), r, 1); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read from the broken rank 1: %v, want ErrCorrupt", err)
	}
	send(0, 2, []byte("still here"))
	if n := counterValue(t, reg, "xrc_shm_peer_errors_total"); n != 1 {
		t.Fatalf("xrc_shm_peer_errors_total is %v, want 1", n)
	}
	if fs := got.failed; len(fs) != 1 || len(fs[1]) != 1 || !errors.Is(fs[1][0], ErrCorrupt) {
		t.Fatalf("the handler heard of failed peers %v, want rank 1 once, with ErrCorrupt", fs)
	}
	if n := strings.Count(logs.String(), "peer failed"); n != 1 {
		t.Fatalf("%d logs of the failed peer, want 1:\n%s", n, logs.String())
	}
}

// TestMaxEagerMixedRings: ranks whose rings have different sizes. A frame
// of MaxEager bytes fits the ring of every peer, the smallest included.
// Before, MaxEager was computed from the rank's own rings, and a frame of
// that size to a rank with smaller ones failed with ErrTooLarge.
func TestMaxEagerMixedRings(t *testing.T) {
	sizes := []int{1 << 16, 4096, 1 << 14}
	ts := connectNode(t, len(sizes), func(rank int) Config { return Config{RingData: sizes[rank]} })
	for from, tr := range ts {
		if want := 4096/4 - frameHdr; tr.MaxEager() != want {
			t.Errorf("rank %d: MaxEager %d, want %d (the smallest ring's)", from, tr.MaxEager(), want)
		}
		for to := range ts {
			ok, err := tr.TrySend(to, make([]byte, tr.MaxEager()))
			if err != nil || !ok {
				t.Errorf("rank %d: frame of MaxEager (%d) bytes to rank %d: %v, %v", from, tr.MaxEager(), to, ok, err)
			}
		}
	}
}
