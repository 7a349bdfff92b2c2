package xrc

import "time"

// Stats describes what the transport holds, for the connection report.
type Stats struct {
	// INIQPs is the INI QPs made (one per remote node talked to);
	// Connected, those in RTS.
	INIQPs, Connected int
	// TGTCreated is the TGT QPs this rank created in the node's domain,
	// TGTOpened those other ranks of the node created and this rank
	// opened. The node holds the TGT QPs its ranks created.
	TGTCreated, TGTOpened int
	// SRQs is the XRC SRQs (1).
	SRQs int
	// RegisteredBytes is the memory registered: receive and send buffers
	// and the registration cache's regions.
	RegisteredBytes int64
	// CachedRegions is the number of regions in the registration cache.
	CachedRegions int
	// QueueBytes estimates the queue memory of the INI QPs, the SRQ and
	// the CQ (verbsx.QueueBytes); TGT QPs have no queues.
	QueueBytes int64
	// SetupTime is the time spent making QPs, opening TGT QPs and taking
	// them to RTR and RTS; HandshakeTime, with lazy connection, the time
	// from a node's first need to its INI QP at RTS, summed over nodes.
	SetupTime, HandshakeTime time.Duration
}

// Stats reports the transport's objects and memory. Call it from the
// goroutine that drives the transport.
func (t *Transport) Stats() Stats {
	u := t.e.Usage()
	s := Stats{INIQPs: u.Conns, Connected: u.Ready, SRQs: 1, RegisteredBytes: u.RegisteredBytes,
		CachedRegions: u.CachedRegions, QueueBytes: u.QueueBytes, SetupTime: u.SetupTime, HandshakeTime: u.HandshakeTime}
	for _, g := range t.tgts {
		if g.created {
			s.TGTCreated++
		} else {
			s.TGTOpened++
		}
	}
	return s
}
