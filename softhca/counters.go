//go:build linux

package softhca

import "sync/atomic"

// Counters are the device's port and error counters. The port counters are
// named as sysfs names them for real HCAs (port_xmit_data counts bytes, not
// the 4-byte words real ports count).
type Counters struct {
	XmitPackets atomic.Uint64 // port_xmit_packets
	XmitData    atomic.Uint64 // port_xmit_data, in bytes of payload
	RcvPackets  atomic.Uint64 // port_rcv_packets
	RcvData     atomic.Uint64 // port_rcv_data, in bytes of payload
	RcvErrors   atomic.Uint64 // port_rcv_errors: packets dropped as malformed or misdirected

	LocalAckTimeoutErr atomic.Uint64 // local_ack_timeout_err: retries exhausted
	RNRNakRetryErr     atomic.Uint64 // rnr_nak_retry_err: RNR retries exhausted
	PacketSeqErr       atomic.Uint64 // packet_seq_err: NAKs for sequence errors received
	DuplicateRequest   atomic.Uint64 // duplicate_request: duplicate requests received
	OutOfSequence      atomic.Uint64 // out_of_sequence: requests ahead of the expected PSN
	ImpliedNakSeqErr   atomic.Uint64 // implied_nak_seq_err
	RNRNaksSent        atomic.Uint64 // RNR NAKs sent by the responder
	RNRNaksReceived    atomic.Uint64
	NaksSent           atomic.Uint64
	Retransmits        atomic.Uint64 // packets sent again
	AckTimeouts        atomic.Uint64 // transport timer expirations

	BadCommands   atomic.Uint64 // commands rejected for their framing or arguments
	BadDoorbells  atomic.Uint64 // doorbells naming no queue of the client
	EventsDropped atomic.Uint64 // events a full or closed channel could not take
	CQOverruns    atomic.Uint64
	LocalErrors   atomic.Uint64 // work requests completed with a local error
}

// Counters returns the device's counters.
func (d *Device) Counters() *Counters { return &d.counters }
