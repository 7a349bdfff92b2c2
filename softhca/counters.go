//go:build linux

package softhca

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xrcrun/xrc/softhca/roce"
)

// Counters are the device's port and error counters. The port counters are
// named as sysfs names them for real HCAs, and count what they count there:
// port_xmit_data and port_rcv_data are the octets of the packets divided
// by 4 (IBA PortCounters: the whole packet but its link CRC), here from
// the IP header through the ICRC (wireWords).
type Counters struct {
	XmitPackets   atomic.Uint64 // port_xmit_packets
	XmitData      atomic.Uint64 // port_xmit_data, in 4-byte words
	RcvPackets    atomic.Uint64 // port_rcv_packets
	RcvData       atomic.Uint64 // port_rcv_data, in 4-byte words
	RcvErrors     atomic.Uint64 // port_rcv_errors: packets dropped as malformed (a bad ICRC included) or misdirected
	RcvICRCErrors atomic.Uint64 // packets dropped for a bad ICRC, of those in RcvErrors
	XmitDiscards  atomic.Uint64 // port_xmit_discards: packets the network would not take

	LocalAckTimeoutErr atomic.Uint64 // local_ack_timeout_err: transport timer expirations retried (see below)
	RNRNakRetryErr     atomic.Uint64 // rnr_nak_retry_err: RNR NAKs received and retried (see below)
	PacketSeqErr       atomic.Uint64 // packet_seq_err: NAKs for sequence errors received
	DuplicateRequest   atomic.Uint64 // duplicate_request: duplicate requests received
	OutOfSequence      atomic.Uint64 // out_of_sequence: requests ahead of the expected PSN
	ImpliedNakSeqErr   atomic.Uint64 // implied_nak_seq_err: responses past the one expected, or acknowledgements past an unanswered READ or atomic
	RNRNaksSent        atomic.Uint64 // RNR NAKs sent by the responder
	RNRNaksReceived    atomic.Uint64
	NaksSent           atomic.Uint64
	XRCSRQErrors       atomic.Uint64 // XRC requests naming no XRC SRQ of their receive QP's domain
	Retransmits        atomic.Uint64 // packets sent again
	AckTimeouts        atomic.Uint64 // transport timer expirations
	// local_ack_timeout_err and rnr_nak_retry_err count as mlx5's
	// hw_counters of those names do: the transport timer expirations and
	// the RNR NAKs received that the requester sends again after, its
	// retry limit not exceeded. The failures when a limit is exceeded
	// (RETRY_EXC_ERR, RNR_RETRY_EXC_ERR) are counted apart, under mlx5's
	// names too.
	ReqTransportRetriesExceeded atomic.Uint64 // req_transport_retries_exceeded
	ReqRNRRetriesExceeded       atomic.Uint64 // req_rnr_retries_exceeded
	// LateTimeouts are the transport timer expirations the engine handled
	// more than a timeout (and 4 ms) late, its process stalled: they
	// resend but do not count against retry_cnt (up to retry_cnt of them
	// between two acknowledgements that make progress).
	LateTimeouts atomic.Uint64
	// LateRounds are the engine's rounds that ended 10 ms (lateRound) or
	// more after the host took in the oldest datagram they read: its
	// answers to that datagram left that late, a delay a peer's transport
	// timer sees as the link's. LateRoundNs adds up how late they were.
	// A packet handed over without a socket (a Fabric's, or one the device
	// sent itself) counts from its handing over.
	LateRounds  atomic.Uint64
	LateRoundNs atomic.Uint64

	FaultDrops    atomic.Uint64 // packets dropped by fault injection
	FaultDups     atomic.Uint64 // packets duplicated by fault injection
	FaultReorders atomic.Uint64 // packets held back by fault injection
	FaultDelays   atomic.Uint64 // packets delayed by fault injection

	BadCommands   atomic.Uint64 // commands rejected for their framing or arguments
	BadDoorbells  atomic.Uint64 // doorbells naming no queue of the client
	BadMessages   atomic.Uint64 // device service messages rejected
	EventsDropped atomic.Uint64 // events a full or closed channel could not take
	CQOverruns    atomic.Uint64
	LocalErrors   atomic.Uint64 // work requests completed with a local error

	// EngineBusyNs is the time the engine spent in rounds that found work
	// (doorbells, packets, timers), in nanoseconds of the device clock,
	// from the start of such a round to the start of the next: how busy
	// the device is, and, divided by the messages it moved, what a
	// message costs the device itself.
	EngineBusyNs atomic.Uint64
}

// Counters returns the device's counters.
func (d *Device) Counters() *Counters { return &d.counters }

// Each calls f with the name, description and value of every counter, in
// a fixed order.
func (c *Counters) Each(f func(name, help string, v uint64)) {
	for _, x := range []struct {
		name, help string
		v          *atomic.Uint64
	}{
		{"port_xmit_packets", "Packets sent.", &c.XmitPackets},
		{"port_xmit_data", "Octets of the packets sent, divided by 4.", &c.XmitData},
		{"port_rcv_packets", "Packets received.", &c.RcvPackets},
		{"port_rcv_data", "Octets of the packets received, divided by 4.", &c.RcvData},
		{"port_rcv_errors", "Packets dropped as malformed (a bad ICRC included) or misdirected.", &c.RcvErrors},
		{"port_rcv_icrc_errors", "Packets dropped for a bad ICRC (counted in port_rcv_errors too).", &c.RcvICRCErrors},
		{"port_xmit_discards", "Packets the network would not take.", &c.XmitDiscards},
		{"local_ack_timeout_err", "Transport timer expirations retried, the retry limit not exceeded.", &c.LocalAckTimeoutErr},
		{"rnr_nak_retry_err", "RNR NAKs received and retried, the RNR retry limit not exceeded.", &c.RNRNakRetryErr},
		{"req_transport_retries_exceeded", "Requests failed after exhausting transport retries.", &c.ReqTransportRetriesExceeded},
		{"req_rnr_retries_exceeded", "Requests failed after exhausting RNR retries.", &c.ReqRNRRetriesExceeded},
		{"packet_seq_err", "Sequence error NAKs received.", &c.PacketSeqErr},
		{"duplicate_request", "Duplicate requests received.", &c.DuplicateRequest},
		{"out_of_sequence", "Requests received ahead of the expected PSN.", &c.OutOfSequence},
		{"implied_nak_seq_err", "Responses found missing by a later acknowledgement.", &c.ImpliedNakSeqErr},
		{"rnr_naks_sent", "RNR NAKs sent.", &c.RNRNaksSent},
		{"rnr_naks_received", "RNR NAKs received.", &c.RNRNaksReceived},
		{"naks_sent", "NAKs sent.", &c.NaksSent},
		{"xrc_srq_errors", "XRC requests naming no XRC SRQ of their receive QP's domain.", &c.XRCSRQErrors},
		{"retransmits", "Packets sent again.", &c.Retransmits},
		{"ack_timeouts", "Transport timer expirations.", &c.AckTimeouts},
		{"late_timeouts", "Transport timer expirations handled more than a timeout late, not counted as retries.", &c.LateTimeouts},
		{"late_rounds", "Engine rounds that ended 10 ms or more after their oldest packet reached the host.", &c.LateRounds},
		{"late_round_ns", "Nanoseconds by which late rounds ended after their oldest packet reached the host.", &c.LateRoundNs},
		{"fault_drops", "Packets dropped by fault injection.", &c.FaultDrops},
		{"fault_dups", "Packets duplicated by fault injection.", &c.FaultDups},
		{"fault_reorders", "Packets held back by fault injection.", &c.FaultReorders},
		{"fault_delays", "Packets delayed by fault injection.", &c.FaultDelays},
		{"bad_commands", "Commands rejected.", &c.BadCommands},
		{"bad_doorbells", "Doorbells naming no queue of the client.", &c.BadDoorbells},
		{"bad_messages", "Device service messages rejected.", &c.BadMessages},
		{"events_dropped", "Events a full or closed channel could not take.", &c.EventsDropped},
		{"cq_overruns", "Completion queue overruns.", &c.CQOverruns},
		{"local_errors", "Work requests completed with a local error.", &c.LocalErrors},
		{"engine_busy_ns", "Nanoseconds the engine spent in rounds that found work.", &c.EngineBusyNs},
	} {
		f(x.name, x.help, x.v.Load())
	}
}

// wireWords is what a packet adds to port_xmit_data or port_rcv_data: its
// length as a RoCEv2 datagram of the device's address family (IP and UDP
// headers, transport headers, payload, pad and ICRC), in 4-byte words. All
// of these are whole words.
func (d *Device) wireWords(p *roce.Packet) uint64 {
	ipUDP := 40 + 8
	if d.addr.Is4() {
		ipUDP = 20 + 8
	}
	return uint64(ipUDP+p.Len()) / 4
}

// collector exports a device's counters and object counts to Prometheus.
type collector struct{ d *Device }

func (c collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	labels := prometheus.Labels{"device": c.d.name}
	c.d.counters.Each(func(name, help string, v uint64) {
		desc := prometheus.NewDesc("xrc_softhca_"+name+"_total", help, nil, labels)
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v))
	})
	o := c.d.Objects()
	for _, x := range []struct {
		kind string
		n    int
	}{{"client", o.Clients}, {"pd", o.PDs}, {"mr", o.MRs}, {"cq", o.CQs}, {"srq", o.SRQs}, {"qp", o.QPs}} {
		desc := prometheus.NewDesc("xrc_softhca_objects", "Live objects of the device by kind.",
			[]string{"kind"}, labels)
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(x.n), x.kind)
	}
}
