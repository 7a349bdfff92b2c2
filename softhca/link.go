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
	// send transmits p, whose ownership it takes.
	send(p *roce.Packet)
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
	f *Fabric
	d *Device
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
	l.f.mu.Unlock()
	return nil
}

func (l *fabricLink) send(p *roce.Packet) {
	l.f.mu.RLock()
	dst := l.f.devices[p.DstGID]
	l.f.mu.RUnlock()
	if dst == nil {
		putPacket(p)
		return
	}
	dst.eng.deliver(p)
}
