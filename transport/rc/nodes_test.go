package rc

import (
	"testing"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/transport/internal/transporttest"
	"github.com/xrcrun/xrc/verbs"
)

// TestUnequalNodes: with nodes of different sizes, a sender's credits
// toward a rank are that rank's share of its receive buffers, shared among
// the ranks of the other nodes, not a share by the sender's own count.
//   - Ranks 0 and 1 of node 0 send to rank 2, alone on node 1, whose 16
//     buffers give each 5 credits: together they stay within them (they
//     had 13 each, 26 for 16 buffers, and the receiver sent RNR NAKs).
//   - Rank 0, alone on node 0, streams to rank 1 of node 1 (of two
//     ranks): its 253 credits were fewer than the 254 frames after which
//     rank 1 returns credits, and the stream stopped for good.
func TestUnequalNodes(t *testing.T) {
	devices := func(n int) ([]*softhca.Device, []*verbs.Context) {
		var ds []*softhca.Device
		var cs []*verbs.Context
		for range n {
			d, c := newDevice(t, softhca.Faults{})
			ds, cs = append(ds, d), append(cs, c)
		}
		return ds, cs
	}
	t.Run("TwoSenders", func(t *testing.T) {
		ds, cs := devices(3)
		ends := jobOn(t, cs, []int{0, 0, 1}, func(c *Config) { c.SRQDepth = 16 })
		sent := 0
		for from := range 2 {
			for {
				ok, err := ends[from].Tr.TrySend(2, []byte{byte(from)})
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				sent++
			}
		}
		if sent > 16 {
			t.Errorf("%d frames unconsumed at a receiver of 16 buffers", sent)
		}
		progress(t, ends, func() bool { return len(ends[2].H.Frames[0])+len(ends[2].H.Frames[1]) == sent })
		if n := ds[2].Counters().RNRNaksSent.Load(); n > 0 {
			t.Errorf("the receiver sent %d RNR NAKs", n)
		}
	})
	t.Run("Stream", func(t *testing.T) {
		_, cs := devices(3)
		transporttest.OneWay(t, jobOn(t, cs, []int{0, 1, 1}, nil), 0, 1, 1000)
	})
}
