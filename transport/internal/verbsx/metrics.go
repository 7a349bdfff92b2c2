package verbsx

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus counters every verbs transport has, named
// xrc_SUBSYSTEM_* and labeled with the rank. A transport adds gauges of
// its own with Gauge before Register.
type Metrics struct {
	subsystem  string
	labels     prometheus.Labels
	reg        prometheus.Registerer
	collectors []prometheus.Collector

	SRQPosted prometheus.Gauge

	SentFrames, SentBytes, RecvFrames, RecvBytes prometheus.Counter
	Reads, ReadBytes, Exposed                    prometheus.Counter
	CreditStalls, QueueStalls                    prometheus.Counter
	CreditMsgs, CreditMsgsIn                     prometheus.Counter
	SRQLimit, CQEvents                           prometheus.Counter
	CompletionErrors, RNRExceeded, AsyncErrors   prometheus.Counter
	PeerErrors, Bad, Connects                    prometheus.Counter
	FailedPeerFrames                             prometheus.Counter
}

// NewMetrics makes the common counters of subsystem ("rc", "xrc") for rank.
func NewMetrics(subsystem string, rank int) *Metrics {
	m := &Metrics{subsystem: subsystem, labels: prometheus.Labels{"rank": strconv.Itoa(rank)}}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "xrc", Subsystem: subsystem, Name: name, Help: help, ConstLabels: m.labels})
		m.collectors = append(m.collectors, c)
		return c
	}
	m.SRQPosted = m.Gauge("srq_posted", "Receive buffers posted to the SRQ.")
	m.SentFrames = counter("sent_frames_total", "Eager frames sent.")
	m.SentBytes = counter("sent_bytes_total", "Bytes of eager frames sent.")
	m.RecvFrames = counter("received_frames_total", "Eager frames received.")
	m.RecvBytes = counter("received_bytes_total", "Bytes of eager frames received.")
	m.Reads = counter("reads_total", "Reads (rendezvous pulls) started.")
	m.ReadBytes = counter("read_bytes_total", "Bytes pulled with RDMA READ.")
	m.Exposed = counter("exposed_total", "Buffers exposed for remote reads.")
	m.CreditStalls = counter("credit_stalls_total", "Sends refused for lack of credits.")
	m.QueueStalls = counter("queue_stalls_total", "Sends refused for a full send queue or no free send buffer.")
	m.CreditMsgs = counter("credit_messages_sent_total", "Credit messages sent.")
	m.CreditMsgsIn = counter("credit_messages_received_total", "Credit messages received.")
	m.SRQLimit = counter("srq_limit_events_total", "SRQ limit events (receive buffers ran low).")
	m.CQEvents = counter("cq_events_total", "Completion events that woke the rank.")
	m.CompletionErrors = counter("completion_errors_total", "Work completions with an error status.")
	m.RNRExceeded = counter("rnr_retry_exceeded_total", "Sends that failed after RNR retries.")
	m.AsyncErrors = counter("async_errors_total", "Error events of the device (QP, SRQ, CQ, port).")
	m.PeerErrors = counter("peer_errors_total", "Peers whose QP failed.")
	m.FailedPeerFrames = counter("failed_peer_frames_total", "Frames dropped because their sender had been reported failed.")
	m.Bad = counter("malformed_total", "Malformed records, remotes, connection requests and completions.")
	m.Connects = counter("connects_total", "QPs connected (brought to RTS, or RTR for receive QPs).")
	return m
}

// Gauge adds a gauge of the transport's own.
func (m *Metrics) Gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "xrc", Subsystem: m.subsystem, Name: name, Help: help, ConstLabels: m.labels})
	m.collectors = append(m.collectors, g)
	return g
}

// Register registers every metric with reg (nothing if reg is nil); on
// error none stays registered.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for i, c := range m.collectors {
		if err := reg.Register(c); err != nil {
			for _, r := range m.collectors[:i] {
				reg.Unregister(r)
			}
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	m.reg = reg
	return nil
}

// Unregister removes the metrics from the registerer of Register.
func (m *Metrics) Unregister() {
	if m == nil || m.reg == nil {
		return
	}
	for _, c := range m.collectors {
		m.reg.Unregister(c)
	}
	m.reg = nil
}
