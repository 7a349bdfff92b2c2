package rc

import (
	"testing"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/transport/internal/transporttest"
	"github.com/xrcrun/xrc/verbs"
)

// newDevice starts an in-process soft HCA speaking RoCEv2 on UDP on a
// loopback address of its own, and opens it.
func newDevice(t testing.TB, faults softhca.Faults) (*softhca.Device, *verbs.Context) {
	t.Helper()
	return transporttest.OpenDevice(t, "rct", softhca.Config{UDP: true, Faults: faults})
}

// end is one rank of a test job.
type end = transporttest.End[*Transport]

// job makes one transport per context, rank i on node i, and connects
// them through an exchange of their records.
func job(t testing.TB, ctxs []*verbs.Context, mod func(*Config)) []*end {
	t.Helper()
	nodes := make([]int, len(ctxs))
	for i := range nodes {
		nodes[i] = i
	}
	return jobOn(t, ctxs, nodes, mod)
}

// jobOn is job with rank i on node nodes[i].
func jobOn(t testing.TB, ctxs []*verbs.Context, nodes []int, mod func(*Config)) []*end {
	t.Helper()
	ends := make([]*end, len(ctxs))
	for i, c := range ctxs {
		k := transporttest.NewKicker()
		cfg := Config{Device: c, Rank: i, Nodes: nodes, Kick: k.Kick}
		if mod != nil {
			mod(&cfg)
		}
		tr, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ends[i] = transporttest.NewEnd(t, tr, k)
	}
	transporttest.Connect(t, ends, nodes)
	return ends
}

var (
	progress = transporttest.Progress[*Transport]
	pattern  = transporttest.Pattern
)
