//go:build linux

package softhca

import (
	"bytes"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca/roce"
)

// TestKeptPacketsOwnTheirPayloads: a packet whose payload is lent from a
// region (mr.lend) is only good until the round's packets are sent, while
// the device mutex is held. A packet kept longer gets its own copy first:
// one looped back to the device or handed to another device of a fabric
// (engine.deliver), and one a fault delays.
func TestKeptPacketsOwnTheirPayloads(t *testing.T) {
	region := make([]byte, 4096)
	for i := range region {
		region[i] = byte(i*7 + 1)
	}
	lent := func() *roce.Packet {
		p := freshPacket(nil)
		p.Payload = region[100:1100:1100]
		return p
	}
	owns := func(t *testing.T, p *roce.Packet) {
		t.Helper()
		if !inStorage(p) || !bytes.Equal(p.Payload, region[100:1100]) {
			t.Fatalf("payload of %d bytes, in its storage: %v, same bytes: %v",
				len(p.Payload), inStorage(p), bytes.Equal(p.Payload, region[100:1100]))
		}
	}
	t.Run("delivered", func(t *testing.T) {
		e := &engine{}
		e.deliver(lent())
		owns(t, e.rx[0])
	})
	t.Run("delayed", func(t *testing.T) {
		d := &Device{clock: &fakeClock{now: time.Unix(0, 0)}}
		fl := newFaulter(Faults{Delay: 1, DelayBy: time.Second})
		p := lent()
		if out := fl.apply(d, p, nil); len(out) != 0 || d.counters.FaultDelays.Load() != 1 {
			t.Fatalf("sent %d packets now, %d delayed", len(out), d.counters.FaultDelays.Load())
		}
		owns(t, p)
	})
}
