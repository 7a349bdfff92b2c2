package xrc

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/transport/internal/verbsx"
	"github.com/xrcrun/xrc/verbs"
)

// Config configures the XRC transport of one rank.
type Config struct {
	// Device is the rank's open verbs device, which must support XRC.
	// The transport creates its objects on it and reads its async events
	// (nobody else may call GetAsyncEvent on it); the caller closes it
	// after the transport's Close.
	Device *verbs.Context
	// Port is the device port (default 1).
	Port uint8
	// Rank is this rank; Nodes is the node of every rank of the job,
	// indexed by rank. The transport carries traffic to the ranks of
	// other nodes.
	Rank  int
	Nodes []int
	// DomainFile names the node's XRC domain: every rank of the node
	// opens (and creates if missing) this file, and the device gives the
	// ranks that open the same file one domain. It must be on a file
	// system every rank of the node sees, and the same for all of them
	// (comm: the job's runtime directory). The first rank of the node
	// removes it at Connect, once every rank has opened it. Required.
	DomainFile string
	// Kick wakes the rank if it sleeps waiting for progress. The
	// transport calls it, from a goroutine of its own, when a completion
	// arrives or a connection comes up. Required.
	Kick func()
	// EagerSize is the size of each receive buffer, and so the largest
	// frame TrySend takes (default 8 KiB + 64 bytes).
	EagerSize int
	// SRQDepth is the number of receive buffers posted to the rank's XRC
	// SRQ (default 512). Every remote rank gets an equal share as its
	// send credits.
	SRQDepth int
	// SendSlots is the number of registered send buffers (default 256).
	SendSlots int
	// SendDepth is the send queue of each INI QP, shared by the sends
	// and reads toward every rank of its node (default 64 per rank of
	// the largest remote node, at most 4096).
	SendDepth int
	// Lazy connects the INI QP toward a node, and the TGT QPs for it, at
	// the first TrySend or Read toward one of its ranks, through
	// Bootstrap's write-once keys, instead of at Connect.
	Lazy bool
	// Bootstrap is required with Lazy.
	Bootstrap *bootstrap.Client
	// Logger gets the transport's logs; nil discards them.
	Logger *slog.Logger
	// Registerer, when not nil, gets the transport's counters, labeled
	// with the rank.
	Registerer prometheus.Registerer
}

func (c *Config) check() error {
	switch {
	case c.Device == nil:
		return errors.New("xrc: no device")
	case c.Kick == nil:
		return errors.New("xrc: no Kick function")
	case c.Rank < 0 || c.Rank >= len(c.Nodes):
		return fmt.Errorf("xrc: rank %d of %d", c.Rank, len(c.Nodes))
	case len(c.Nodes) > verbsx.MaxRanks:
		return fmt.Errorf("xrc: %d ranks: at most %d", len(c.Nodes), verbsx.MaxRanks)
	case c.DomainFile == "":
		return errors.New("xrc: no XRC domain file")
	case c.Lazy && c.Bootstrap == nil:
		return errors.New("xrc: lazy connect needs a bootstrap client")
	}
	for r, n := range c.Nodes {
		if n < 0 || n >= verbsx.MaxRanks {
			return fmt.Errorf("xrc: rank %d on node %d", r, n)
		}
	}
	if c.Port == 0 {
		c.Port = 1
	}
	if c.SendDepth == 0 {
		per := map[int]int{}
		most := 1
		for _, n := range c.Nodes {
			per[n]++
			if n != c.Nodes[c.Rank] {
				most = max(most, per[n])
			}
		}
		c.SendDepth = min(4096, verbsx.DefaultSendDepth*most)
	}
	sz := verbsx.Sizes{EagerSize: c.EagerSize, SRQDepth: c.SRQDepth, SendSlots: c.SendSlots, SendDepth: c.SendDepth}
	if err := sz.Check(); err != nil {
		return fmt.Errorf("xrc: %w", err)
	}
	c.EagerSize, c.SRQDepth, c.SendSlots, c.SendDepth = sz.EagerSize, sz.SRQDepth, sz.SendSlots, sz.SendDepth
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}
