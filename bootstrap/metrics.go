package bootstrap

import (
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

type serverMetrics struct {
	joins        prometheus.Counter
	authFailures prometheus.Counter
	badMessages  *prometheus.CounterVec // by reason
	rejected     prometheus.Counter
	refused      prometheus.Counter
	acceptErrors prometheus.Counter
	aborts       prometheus.Counter
	readPauses   prometheus.Counter
	// refusedRequests counts requests past a bound on what a rank may
	// make the server hold (job.go), by limit: waiting_gets,
	// waiting_get_bytes, collectives_ahead.
	refusedRequests *prometheus.CounterVec
	bytesIn         prometheus.Counter
	bytesOut        prometheus.Counter
	members         prometheus.Gauge
}

func newServerMetrics(reg prometheus.Registerer) *serverMetrics {
	c := func(name, help string) prometheus.Counter {
		return register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "xrc_bootstrap_server_" + name, Help: help}))
	}
	m := &serverMetrics{
		joins:        c("joins_total", "Ranks registered."),
		authFailures: c("auth_failures_total", "Connections that failed to prove the job key."),
		rejected:     c("rejected_total", "Registrations refused (rank out of range, duplicate, size mismatch)."),
		refused:      c("refused_connections_total", "Connections closed at once because too many were in their handshake."),
		acceptErrors: c("accept_errors_total", "Accepts that failed for a while (out of descriptors or buffers) and were retried."),
		aborts:       c("aborts_total", "Jobs aborted."),
		readPauses: c("read_pauses_total", "Times the server stopped reading a rank's requests because more than "+
			"maxQueued bytes (4 MiB) queued for it were not yet written: the rank reads slowly or not at all."),
		bytesIn:  c("received_bytes_total", "Bytes of frames received."),
		bytesOut: c("sent_bytes_total", "Bytes of frames sent."),
		badMessages: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "xrc_bootstrap_server_bad_messages_total",
			Help: "Messages rejected as oversized, truncated, garbled, of an unknown type or version, or out of place."}, []string{"reason"})),
		refusedRequests: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "xrc_bootstrap_server_refused_requests_total",
			Help: "Requests of a rank refused, aborting the job, because they passed a bound on what a rank may make the server hold: " +
				"gets waiting for keys nobody has put (waiting_gets: 65,536; waiting_get_bytes: 16 MiB of keys), " +
				"or collectives entered ahead of the other ranks (collectives_ahead: 16)."}, []string{"limit"})),
		members: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "xrc_bootstrap_server_members",
			Help: "Ranks registered and connected."})),
	}
	return m
}

type clientMetrics struct {
	calls    *prometheus.CounterVec // by operation
	bytesIn  prometheus.Counter
	bytesOut prometheus.Counter
}

func newClientMetrics(reg prometheus.Registerer) *clientMetrics {
	return &clientMetrics{
		calls: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "xrc_bootstrap_client_calls_total",
			Help: "Calls by operation."}, []string{"op"})),
		bytesIn: register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "xrc_bootstrap_client_received_bytes_total",
			Help: "Bytes of frames received from the server."})),
		bytesOut: register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "xrc_bootstrap_client_sent_bytes_total",
			Help: "Bytes of frames sent to the server."})),
	}
}

// register registers c with reg (if any) and returns it, or the collector
// already registered under its name, so that several clients or servers
// may share a registerer.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(C); ok {
				return old
			}
		}
	}
	return c
}

// reasonOf is the bad-message metric's label for a protocol error.
func reasonOf(err error) string {
	var bm *badMessage
	if errors.As(err, &bm) {
		return bm.reason
	}
	return "other"
}

func discard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
