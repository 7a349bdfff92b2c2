package xrc

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xrcrun/xrc/transport/internal/verbsx"
)

// metrics are the transport's Prometheus counters, xrc_xrc_*, labeled
// with the rank: the verbs transports' common ones and the QP gauges
// (the INI QPs' is the Endpoint's).
type metrics struct {
	*verbsx.Metrics
	iniQPs, tgtCreated, tgtOpened prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, rank int) (*metrics, error) {
	m := &metrics{Metrics: verbsx.NewMetrics("xrc", rank)}
	m.iniQPs = m.Gauge("ini_qps", "XRC INI (send) QPs of the rank, one per remote node.")
	m.tgtCreated = m.Gauge("tgt_qps_created", "XRC TGT (receive) QPs the rank created in its node's domain.")
	m.tgtOpened = m.Gauge("tgt_qps_opened", "XRC TGT QPs other ranks of the node created and the rank opened.")
	if err := m.Register(reg); err != nil {
		return nil, fmt.Errorf("xrc: %w", err)
	}
	return m, nil
}
