package softhca_test

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/xrcrun/xrc/verbs"
)

// BenchmarkQPScalingInTurns measures what BenchmarkQPScaling's
// like-for-like load measures, for all the QP counts at once: the
// counts take turns, each sending a burst of messages (at least three per
// QP pair) while the others wait, and each count's time is summed over
// its bursts. On a shared machine the other guests take more or less of
// the last-level cache from one second to the next, and that moves the
// cost of a message with many QPs by tens of percent; run in turns, every
// count sees the same machine, so the rise between them is the QP count's.
//
// qps=N is the QPs on a device. two-devices is BenchmarkQPScaling's setup:
// N pairs between two devices, so that one process holds 2N QPs, under
// depth1-window10. one-device is the setup read to the letter
// ("10, 1,000 and 10,000 connected RC QPs on one device"): N/2 pairs on
// one device, which loops every packet back to itself, under
// depth1-window5 (the most 5 pairs carry with one message per QP). For
// each count it reports ns/msg and dev-ns/msg (as ns/op and dev-ns/msg of
// BenchmarkQPScaling), and for the largest count the rise of both over the
// smallest, in percent. b.N is the messages over all counts. XRC_SCALE_QPS
// sets the counts (at least two), XRC_SCALE_ORDER the order of the QPs
// (BenchmarkQPScaling).
func BenchmarkQPScalingInTurns(b *testing.B) {
	counts, err := scaleCounts(os.Getenv("XRC_SCALE_QPS"))
	if err != nil {
		b.Fatal(err)
	}
	slices.Sort(counts)
	if counts = slices.Compact(counts); len(counts) < 2 {
		b.Fatalf("XRC_SCALE_QPS=%v: the benchmark compares two QP counts or more", counts)
	}
	for _, v := range []struct {
		name            string
		devices, window int
	}{{"two-devices", 2, 10}, {"one-device", 1, 5}} {
		b.Run(v.name, func(b *testing.B) {
			setups := make([]*scaleSetup, len(counts))
			for i, n := range counts {
				pairs := n
				if v.devices == 1 {
					if n%2 != 0 {
						b.Fatalf("qps=%d: one device needs an even QP count, its QPs connect in pairs", n)
					}
					pairs = n / 2
				}
				if pairs < v.window {
					b.Fatalf("qps=%d: %d pairs, fewer than the load's window of %d", n, pairs, v.window)
				}
				setups[i] = newScaleSetup(b, v.devices, pairs)
			}
			for _, op := range []struct {
				name string
				op   verbs.WROpcode
			}{{"send", verbs.WRSend}, {"write", verbs.WRRDMAWrite}} {
				b.Run(op.name, func(b *testing.B) { runInTurns(b, counts, setups, op.op, v.window) })
			}
		})
	}
}

// runInTurns sends b.N messages over the setups, a burst on each in turn,
// and reports each one's cost.
func runInTurns(b *testing.B, counts []int, setups []*scaleSetup, op verbs.WROpcode, window int) {
	loads := make([]*scaleLoad, len(setups))
	burst := 0
	for i, s := range setups {
		loads[i] = s.load(b, op, 1, window)
		loads[i].warm()
		burst = max(burst, 3*s.n)
	}
	type tally struct {
		elapsed          time.Duration
		msgs             int
		busy             uint64 // the engines' busy time over the bursts
		busy0, recovery0 uint64 // the counters before them
	}
	t := make([]tally, len(setups))
	for i, s := range setups {
		_, t[i].recovery0, t[i].busy0 = s.counts()
	}
	share := max(b.N/len(setups), 1)
	b.ResetTimer()
	for turn := 0; t[0].msgs < share; turn++ { // every count sends as many
		for j := range loads {
			k := (turn + j) % len(loads) // each turn starts with the next count
			l, m := loads[k], min(burst, share-t[k].msgs)
			start := time.Now()
			for range m {
				l.post()
			}
			l.drain()
			t[k].elapsed += time.Since(start)
			t[k].msgs += m
		}
	}
	b.StopTimer()
	for i, s := range setups {
		_, recovery, busy := s.counts()
		if recovery > t[i].recovery0 {
			b.Errorf("qps=%d: %d retransmissions and RNR NAKs: the figures include recovery", counts[i], recovery-t[i].recovery0)
		}
		t[i].busy = busy - t[i].busy0
	}
	ns := func(i int) float64 { return float64(t[i].elapsed.Nanoseconds()) / float64(t[i].msgs) }
	dev := func(i int) float64 { return float64(t[i].busy) / float64(t[i].msgs) }
	for i, n := range counts {
		b.ReportMetric(ns(i), fmt.Sprintf("qps=%d-ns/msg", n))
		b.ReportMetric(dev(i), fmt.Sprintf("qps=%d-dev-ns/msg", n))
	}
	last := len(counts) - 1
	b.ReportMetric(100*(ns(last)/ns(0)-1), fmt.Sprintf("qps=%d-rise-%%", counts[last]))
	b.ReportMetric(100*(dev(last)/dev(0)-1), fmt.Sprintf("qps=%d-dev-rise-%%", counts[last]))
}
