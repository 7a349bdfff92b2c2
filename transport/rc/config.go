package rc

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/transport/internal/verbsx"
	"github.com/xrcrun/xrc/verbs"
)

// Config configures the RC transport of one rank.
type Config struct {
	// Device is the rank's open verbs device. The transport creates its
	// objects on it and reads its async events (one reader per device
	// context: nobody else may call GetAsyncEvent on it); the caller
	// closes it after the transport's Close.
	Device *verbs.Context
	// Port is the device port (default 1).
	Port uint8
	// Rank is this rank; Nodes is the node of every rank of the job,
	// indexed by rank. The transport carries traffic to the ranks of
	// other nodes.
	Rank  int
	Nodes []int
	// Kick wakes the rank if it sleeps waiting for progress. The
	// transport calls it, from a goroutine of its own, when a completion
	// arrives or a connection comes up. Required.
	Kick func()
	// EagerSize is the size of each receive buffer, and so the largest
	// frame TrySend takes (default 8 KiB + 64 bytes, for comm's header).
	EagerSize int
	// SRQDepth is the number of receive buffers posted to the shared
	// receive queue (default 512). Every remote rank gets an equal share
	// as its send credits.
	SRQDepth int
	// SendSlots is the number of registered send buffers (default 256):
	// eager frames too large to be sent inline are copied into one until
	// their send completes.
	SendSlots int
	// SendDepth is the send queue of each QP (default 64).
	SendDepth int
	// Lazy connects a QP to a peer at the first TrySend or Read toward
	// it, through Bootstrap's write-once keys, instead of at Connect.
	Lazy      bool
	Bootstrap *bootstrap.Client
	// Logger gets the transport's logs; nil discards them.
	Logger *slog.Logger
	// Registerer, when not nil, gets the transport's counters, labeled
	// with the rank.
	Registerer prometheus.Registerer
}

// Defaults.
const (
	DefaultEagerSize = verbsx.DefaultEagerSize
	DefaultSRQDepth  = verbsx.DefaultSRQDepth
	DefaultSendSlots = verbsx.DefaultSendSlots
	DefaultSendDepth = verbsx.DefaultSendDepth
)

func (c *Config) check() error {
	if c.Device == nil {
		return errors.New("rc: no device")
	}
	if c.Kick == nil {
		return errors.New("rc: no Kick function")
	}
	if c.Rank < 0 || c.Rank >= len(c.Nodes) {
		return fmt.Errorf("rc: rank %d of %d", c.Rank, len(c.Nodes))
	}
	if c.Lazy && c.Bootstrap == nil {
		return errors.New("rc: lazy connect needs a bootstrap client")
	}
	if c.Port == 0 {
		c.Port = 1
	}
	sz := verbsx.Sizes{EagerSize: c.EagerSize, SRQDepth: c.SRQDepth, SendSlots: c.SendSlots, SendDepth: c.SendDepth}
	if err := sz.Check(); err != nil {
		return fmt.Errorf("rc: %w", err)
	}
	c.EagerSize, c.SRQDepth, c.SendSlots, c.SendDepth = sz.EagerSize, sz.SRQDepth, sz.SendSlots, sz.SendDepth
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}
