package rc

import (
	"bytes"
	"testing"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/bootstrap/boottest"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

// clients joins n ranks, each on a node of its own, to a rendezvous
// server of their own.
func clients(t *testing.T, n int) []*bootstrap.Client {
	nodes := make([]int, n)
	for r := range nodes {
		nodes[r] = r
	}
	return boottest.Clients(t, nodes)
}

// lazyJob is a job of n ranks, each on a node and a device of its own,
// that connect lazily through a rendezvous server.
func lazyJob(t *testing.T, n int) []*end {
	cs := clients(t, n)
	var ctxs []*verbs.Context
	for range n {
		_, c := newDevice(t, softhca.Faults{})
		ctxs = append(ctxs, c)
	}
	return job(t, ctxs, func(c *Config) { c.Lazy, c.Bootstrap = true, cs[c.Rank] })
}

// TestLazy: with lazy connection no QP exists before the first frame;
// frames both ways (both ranks start at once), then a read, connect each
// pair once; a rank that talks to nobody makes no QP.
func TestLazy(t *testing.T) {
	ends := lazyJob(t, 3)
	for _, e := range ends {
		if st := e.Tr.Stats(); st.QPs != 0 {
			t.Fatalf("stats before traffic: %+v", st)
		}
	}
	pair := ends[:2]
	stream(t, pair, 500)
	src := pattern(9, 3<<20)
	rm, err := ends[1].Tr.Expose(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(src))
	if err := ends[0].Tr.Read(1, dst, rm, 1); err != nil {
		t.Fatal(err)
	}
	progress(t, pair, func() bool { _, ok := ends[0].H.Reads[1]; return ok })
	if err := ends[0].H.Reads[1]; err != nil || !bytes.Equal(dst, src) {
		t.Fatalf("read: %v", err)
	}
	// A read toward a rank not connected yet waits for the connection.
	dst2 := make([]byte, 100)
	src2 := pattern(3, 100)
	rm2, err := ends[2].Tr.Expose(src2)
	if err != nil {
		t.Fatal(err)
	}
	if err := ends[1].Tr.Read(2, dst2, rm2, 2); err != nil {
		t.Fatal(err)
	}
	progress(t, ends, func() bool { _, ok := ends[1].H.Reads[2]; return ok })
	if err := ends[1].H.Reads[2]; err != nil || !bytes.Equal(dst2, src2) {
		t.Fatalf("read: %v", err)
	}
	want := []int{1, 2, 1}
	for i, e := range ends {
		if st := e.Tr.Stats(); st.QPs != want[i] || st.Connected != want[i] || st.HandshakeTime <= 0 || st.SetupTime <= 0 {
			t.Errorf("rank %d: %+v, want %d QPs", i, st, want[i])
		}
	}
}
