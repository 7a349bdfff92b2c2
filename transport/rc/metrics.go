package rc

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the transport's Prometheus counters, labeled with the rank.
type metrics struct {
	reg        prometheus.Registerer
	collectors []prometheus.Collector

	qps, srqPosted prometheus.Gauge

	sentFrames, sentBytes, recvFrames, recvBytes prometheus.Counter
	reads, readBytes, exposed                    prometheus.Counter
	creditStalls, queueStalls                    prometheus.Counter
	creditMsgs, creditMsgsIn                     prometheus.Counter
	srqLimit, cqEvents                           prometheus.Counter
	completionErrors, rnrExceeded, asyncErrors   prometheus.Counter
	peerErrors, bad, connects                    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, rank int) (*metrics, error) {
	m := &metrics{reg: reg}
	labels := prometheus.Labels{"rank": strconv.Itoa(rank)}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "xrc", Subsystem: "rc", Name: name, Help: help, ConstLabels: labels})
		m.collectors = append(m.collectors, g)
		return g
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "xrc", Subsystem: "rc", Name: name, Help: help, ConstLabels: labels})
		m.collectors = append(m.collectors, c)
		return c
	}
	m.qps = gauge("qps", "RC QPs of the rank.")
	m.srqPosted = gauge("srq_posted", "Receive buffers posted to the SRQ.")
	m.sentFrames = counter("sent_frames_total", "Eager frames sent.")
	m.sentBytes = counter("sent_bytes_total", "Bytes of eager frames sent.")
	m.recvFrames = counter("received_frames_total", "Eager frames received.")
	m.recvBytes = counter("received_bytes_total", "Bytes of eager frames received.")
	m.reads = counter("reads_total", "Reads (rendezvous pulls) started.")
	m.readBytes = counter("read_bytes_total", "Bytes pulled with RDMA READ.")
	m.exposed = counter("exposed_total", "Buffers exposed for remote reads.")
	m.creditStalls = counter("credit_stalls_total", "Sends refused for lack of credits.")
	m.queueStalls = counter("queue_stalls_total", "Sends refused for a full send queue or no free send buffer.")
	m.creditMsgs = counter("credit_messages_sent_total", "Credit messages sent.")
	m.creditMsgsIn = counter("credit_messages_received_total", "Credit messages received.")
	m.srqLimit = counter("srq_limit_events_total", "SRQ limit events (receive buffers ran low).")
	m.cqEvents = counter("cq_events_total", "Completion events that woke the rank.")
	m.completionErrors = counter("completion_errors_total", "Work completions with an error status.")
	m.rnrExceeded = counter("rnr_retry_exceeded_total", "Sends that failed after RNR retries.")
	m.asyncErrors = counter("async_errors_total", "Error events of the device (QP, SRQ, CQ, port).")
	m.peerErrors = counter("peer_errors_total", "Peers whose QP failed.")
	m.bad = counter("malformed_total", "Malformed records, remotes, connection requests and completions.")
	m.connects = counter("connects_total", "QPs connected (brought to RTS).")
	if reg == nil {
		return m, nil
	}
	var errs []error
	for i, c := range m.collectors {
		if err := reg.Register(c); err != nil {
			for _, r := range m.collectors[:i] {
				reg.Unregister(r)
			}
			errs = append(errs, err)
			break
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("rc: register metrics: %w", err)
	}
	return m, nil
}

func (m *metrics) unregister() {
	if m == nil || m.reg == nil {
		return
	}
	for _, c := range m.collectors {
		m.reg.Unregister(c)
	}
	m.reg = nil
}
