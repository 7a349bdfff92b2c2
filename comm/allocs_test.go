//go:build !race

package comm

import (
	"runtime"
	"testing"
)

// TestPingPongAllocs: a small message, sent and received with Send and
// Recv between two ranks of a node, allocates nothing, on either side, in
// the steady state (the race detector allocates on its own: not under it).
func TestPingPongAllocs(t *testing.T) {
	const rounds = 2000
	pp, done := pingPong(t, world(t, 2, nil), 8, 101+rounds)
	for range 101 {
		pp()
	}
	// Counted as -benchmem counts, at the CPUs the test has
	// (testing.AllocsPerRun would take them down to one). A rank that a
	// loaded machine keeps waiting past comm's spin sleeps, which
	// allocates nothing either with a context that cannot end; half an
	// allocation a round trip is let go all the same, where one a message
	// would make two.
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for range rounds {
		pp()
	}
	runtime.ReadMemStats(&m1)
	if n := float64(m1.Mallocs-m0.Mallocs) / rounds; n >= 0.5 {
		t.Errorf("%.2f allocations a round trip, want none", n)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
