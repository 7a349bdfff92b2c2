package rc

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xrcrun/xrc/transport/internal/verbsx"
)

// newMetrics makes the transport's Prometheus counters, xrc_rc_*, labeled
// with the rank: the verbs transports' common ones and the gauge of the
// QPs.
func newMetrics(reg prometheus.Registerer, rank int) (*verbsx.Metrics, prometheus.Gauge, error) {
	m := verbsx.NewMetrics("rc", rank)
	qps := m.Gauge("qps", "RC QPs of the rank.")
	if err := m.Register(reg); err != nil {
		return nil, nil, fmt.Errorf("rc: %w", err)
	}
	return m, qps, nil
}
