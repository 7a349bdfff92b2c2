package shm

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the transport's Prometheus counters, xrc_shm_*, labeled with
// the rank.
type metrics struct {
	reg prometheus.Registerer // nil when not registered
	// peerErrors counts the local peers whose ring into this rank's inbox
	// was found corrupt: the transport stopped reading it and fails the
	// calls toward them.
	peerErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, rank int) (*metrics, error) {
	m := &metrics{
		peerErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "xrc", Subsystem: "shm", Name: "peer_errors_total",
			Help:        "Local peers dropped because their ring into this rank's inbox was corrupt.",
			ConstLabels: prometheus.Labels{"rank": strconv.Itoa(rank)},
		}),
	}
	if reg != nil {
		if err := reg.Register(m.peerErrors); err != nil {
			return nil, fmt.Errorf("shm: register metrics: %w", err)
		}
		m.reg = reg
	}
	return m, nil
}

// unregister removes the counters from the registerer of newMetrics.
func (m *metrics) unregister() {
	if m.reg != nil {
		m.reg.Unregister(m.peerErrors)
		m.reg = nil
	}
}
