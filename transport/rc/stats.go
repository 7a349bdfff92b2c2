package rc

import "time"

// Stats describes what the transport holds, for the connection report.
type Stats struct {
	QPs  int // RC QPs made (connected or connecting)
	SRQs int
	// Connected is the number of QPs in RTS.
	Connected int
	// RegisteredBytes is the memory registered: receive and send buffers
	// and the registration cache's regions.
	RegisteredBytes int64
	// CachedRegions is the number of regions in the registration cache.
	CachedRegions int
	// QueueBytes estimates the queue memory of the QPs, the SRQ and the
	// CQ, from the layout of the mlx4 provider (verbsx.QueueBytes).
	QueueBytes int64
	// SetupTime is the time spent making QPs and taking them to RTS;
	// HandshakeTime, with lazy connection, the time from a peer's first
	// need to its QP at RTS, summed over peers.
	SetupTime, HandshakeTime time.Duration
}

// Stats reports the transport's objects and memory. Call it from the
// goroutine that drives the transport.
func (t *Transport) Stats() Stats {
	u := t.e.Usage()
	return Stats{QPs: u.Conns, SRQs: 1, Connected: u.Ready, RegisteredBytes: u.RegisteredBytes,
		CachedRegions: u.CachedRegions, QueueBytes: u.QueueBytes, SetupTime: u.SetupTime, HandshakeTime: u.HandshakeTime}
}
