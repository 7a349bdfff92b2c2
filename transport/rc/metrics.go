package rc

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xrcrun/xrc/transport/internal/verbsx"
)

// metrics are the transport's Prometheus counters, xrc_rc_*, labeled with
// the rank: the verbs transports' common ones and the QP gauge.
type metrics struct {
	*verbsx.Metrics
	qps prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, rank int) (*metrics, error) {
	m := &metrics{Metrics: verbsx.NewMetrics("rc", rank)}
	m.qps = m.Gauge("qps", "RC QPs of the rank.")
	if err := m.Register(reg); err != nil {
		return nil, fmt.Errorf("rc: %w", err)
	}
	return m, nil
}
