//go:build linux

package softhca

import (
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/xrcrun/xrc/softhca/roce"
)

// Faults describe what the device does wrong on purpose to the packets it
// sends, since a test machine's kernel may have no netem. Each probability
// applies to each packet independently; the choices come from a generator
// seeded with Seed, so a run can be repeated.
type Faults struct {
	Loss      float64       // the packet is dropped
	Duplicate float64       // the packet is sent twice
	Reorder   float64       // the packet is held back and sent after the next one, or at the end of the engine's round
	Delay     float64       // the packet is sent DelayBy later
	DelayBy   time.Duration // how late a delayed packet is
	Seed      uint64
}

func (f Faults) none() bool {
	return f.Loss == 0 && f.Duplicate == 0 && f.Reorder == 0 && f.Delay == 0
}

// faulter applies Faults in the engine's send path. It is owned by the
// engine goroutine.
type faulter struct {
	def   Faults
	links map[netip.Addr]Faults // per destination, replacing def
	rng   *rand.Rand
	held  []*roce.Packet // reordered packets, sent after the next one
}

func newFaulter(f Faults) *faulter {
	return &faulter{def: f, rng: rand.New(rand.NewPCG(f.Seed, f.Seed^0x9e3779b97f4a7c15))}
}

// SetLinkFaults sets the faults of the packets the device sends to dst,
// replacing the device's default for that destination. The zero Faults
// makes the link clean.
func (d *Device) SetLinkFaults(dst netip.Addr, f Faults) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fl := d.eng.faults
	if fl.links == nil {
		fl.links = map[netip.Addr]Faults{}
	}
	fl.links[dst.Unmap()] = f
}

// SetFaults replaces the device's default faults.
func (d *Device) SetFaults(f Faults) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.eng.faults.def = f
}

// apply decides the fate of an outgoing packet: it sends it (with send)
// zero, one or two times, now or later. Caller holds d.mu and is the
// engine goroutine (it uses the engine's packet cache).
func (fl *faulter) apply(d *Device, p *roce.Packet, out []*roce.Packet) []*roce.Packet {
	f := fl.def
	if len(fl.links) > 0 {
		if lf, ok := fl.links[netip.AddrFrom16(p.DstGID).Unmap()]; ok {
			f = lf
		}
	}
	if f.none() {
		out = append(out, p)
		return fl.release(out)
	}
	r := fl.rng
	switch {
	case r.Float64() < f.Loss:
		d.counters.FaultDrops.Add(1)
		d.eng.pkts.put(p)
		return out
	case r.Float64() < f.Reorder:
		d.counters.FaultReorders.Add(1)
		fl.held = append(fl.held, p)
		return out
	case r.Float64() < f.Delay:
		d.counters.FaultDelays.Add(1)
		own(p)
		d.clock.AfterFunc(f.DelayBy, func() { d.transmit([]*roce.Packet{p}, nil) })
		return out
	}
	out = append(out, p)
	if r.Float64() < f.Duplicate {
		d.counters.FaultDups.Add(1)
		out = append(out, clonePacket(&d.eng.pkts, p))
	}
	return fl.release(out)
}

// release sends the held packets after the one just sent.
func (fl *faulter) release(out []*roce.Packet) []*roce.Packet {
	out = append(out, fl.held...)
	clear(fl.held)
	fl.held = fl.held[:0]
	return out
}

func clonePacket(c *pktCache, p *roce.Packet) *roce.Packet {
	q := c.get()
	payload := append(q.Payload, p.Payload...)
	storage := q.Storage
	*q = *p
	q.Payload, q.Storage = payload, storage
	return q
}
