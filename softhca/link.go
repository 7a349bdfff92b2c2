//go:build linux

package softhca

import (
	"fmt"
	"sync"

	"github.com/xrcrun/xrc/softhca/roce"
)

// A link carries the device's packets to other devices: a Fabric within
// the process, or RoCEv2 over UDP between processes and machines.
type link interface {
	// sendBatch transmits packets in order, taking their ownership; the
	// packets it is done with go to c, the packet cache of the calling
	// goroutine (nil: the shared pool).
	sendBatch(ps []*roce.Packet, c *pktCache)
	// poll appends up to max packets that arrived and were not delivered
	// to the engine yet. Only the engine calls it.
	poll(out []*roce.Packet, max int) []*roce.Packet
	// idle tells the link the engine is about to sleep: a packet that
	// comes must wake it (e.eng.kick).
	idle()
	close() error
}

// Fabric connects the devices of one process: a packet sent to a GID is
// delivered to the device of that GID, if any (as on a network, a packet
// to nowhere is lost).
type Fabric struct {
	mu      sync.RWMutex
	devices map[[16]byte]*Device
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric { return &Fabric{devices: map[[16]byte]*Device{}} }

// fabricLink is a device's attachment to a Fabric.
type fabricLink struct {
	f      *Fabric
	d      *Device
	closed bool // guarded by f.mu
}

func (f *Fabric) attach(d *Device) (link, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, dup := f.devices[d.gid]; dup {
		return nil, fmt.Errorf("softhca: address %v already used on this fabric", d.addr)
	}
	f.devices[d.gid] = d
	return &fabricLink{f: f, d: d}, nil
}

func (l *fabricLink) close() error {
	l.f.mu.Lock()
	if l.f.devices[l.d.gid] == l.d {
		delete(l.f.devices, l.d.gid)
	}
	l.closed = true // a delayed packet's timer may still fire: sendBatch drops it
	l.f.mu.Unlock()
	return nil
}

// poll finds nothing: a fabric delivers to the engine directly.
func (l *fabricLink) poll(out []*roce.Packet, max int) []*roce.Packet { return out }

// idle needs nothing: a fabric kicks the engine of every packet it
// delivers.
func (l *fabricLink) idle() {}

func (l *fabricLink) sendBatch(ps []*roce.Packet, c *pktCache) {
	l.f.mu.RLock()
	defer l.f.mu.RUnlock()
	for _, p := range ps {
		if dst := l.f.devices[p.DstGID]; dst != nil && !l.closed {
			dst.eng.deliver(p)
		} else {
			c.put(p)
		}
	}
}
