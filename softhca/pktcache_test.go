package softhca

import (
	"testing"

	"github.com/xrcrun/xrc/softhca/roce"
)

// TestPacketCache checks that an engine's packet cache stays bounded,
// exchanges batches with the shared pool, and hands out cleared packets.
func TestPacketCache(t *testing.T) {
	var c pktCache
	ps := make([]*roce.Packet, 5*cacheBatch)
	for i := range ps {
		ps[i] = c.get()
		ps[i].PSN = uint32(i)
		ps[i].Payload = append(ps[i].Payload, 1, 2, 3)
	}
	for _, p := range ps {
		c.put(p)
		if len(c.free) > 2*cacheBatch {
			t.Fatalf("cache holds %d packets, more than %d", len(c.free), 2*cacheBatch)
		}
	}
	c.spill(len(c.free))
	if len(c.free) != 0 {
		t.Fatalf("%d packets left after spilling all", len(c.free))
	}
	var other pktCache // another engine takes what this one gave back
	for range 3 * cacheBatch {
		p := other.get()
		if p.PSN != 0 || len(p.Payload) != 0 || cap(p.Payload) < 4096 {
			t.Fatalf("packet from the cache not cleared: PSN %d, payload %d of %d", p.PSN, len(p.Payload), cap(p.Payload))
		}
	}
	var shared *pktCache // nil: the shared pool
	shared.put(shared.get())
}
