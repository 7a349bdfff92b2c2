package comm

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/transport/rc"
	"github.com/xrcrun/xrc/transport/xrc"
	"github.com/xrcrun/xrc/verbs"

	// The drivers of the devices XRC_DEVICE may name: software HCAs
	// (softhca's "soft" driver) and, through it, mlx4 hardware.
	_ "github.com/xrcrun/xrc/softhca"
)

// fabricChoice is how a rank reaches the ranks of other nodes.
type fabricChoice struct {
	transport string // "rc" or "xrc"
	lazy      bool
	device    string
}

// chooseFabric decides the inter-node transport: cfg, else what the
// launcher said (env), else the XRC_* variables, else auto (RC, eager
// connection).
func chooseFabric(cfg *Config, env *bootstrap.Env) (fabricChoice, error) {
	pick := func(vals ...string) string {
		for _, v := range vals {
			if v != "" {
				return strings.ToLower(v)
			}
		}
		return ""
	}
	var f fabricChoice
	switch t := pick(cfg.Transport, env.Transport, os.Getenv(bootstrap.EnvTransport)); t {
	case "", "auto", "rc":
		f.transport = "rc"
	case "xrc":
		f.transport = "xrc"
	default:
		return f, fmt.Errorf("comm: unknown transport %q (XRC_TRANSPORT): rc, xrc or auto", t)
	}
	switch c := pick(cfg.Connect, env.Connect, os.Getenv(bootstrap.EnvConnect)); c {
	case "", "eager":
	case "lazy":
		f.lazy = true
	default:
		return f, fmt.Errorf("comm: unknown connection mode %q (XRC_CONNECT): eager or lazy", c)
	}
	f.device = pick(env.Device, os.Getenv(bootstrap.EnvDevice))
	return f, nil
}

// openDevice opens the rank's verbs device: cfg.OpenDevice if set, else
// the device XRC_DEVICE names (the first one listed if empty).
func openDevice(ctx context.Context, cfg *Config, env *bootstrap.Env, f fabricChoice) (*verbs.Context, error) {
	if cfg.OpenDevice != nil {
		d, err := cfg.OpenDevice(ctx, env)
		if err != nil {
			return nil, fmt.Errorf("comm: open the rank's device: %w", err)
		}
		return d, nil
	}
	d, err := verbs.Open(ctx, f.device, verbs.Config{Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("comm: ranks on other nodes need a verbs device (XRC_DEVICE): %w", err)
	}
	return d, nil
}

// newFabric makes the rank's transport toward other nodes on dev: RC, or
// XRC with the node's domain file in the job's runtime directory.
func newFabric(cfg *Config, env *bootstrap.Env, jobID string, boot *bootstrap.Client, dev *verbs.Context, nodes []int,
	f fabricChoice, kick func()) (transport.Transport, error) {
	if f.transport == "xrc" {
		t, err := xrc.New(xrc.Config{Device: dev, Rank: env.Rank, Nodes: nodes, Kick: kick, Lazy: f.lazy, Bootstrap: boot,
			DomainFile: filepath.Join(cfg.Dir, fmt.Sprintf("xrcd-%s-%d", jobID, env.Node)),
			Logger:     cfg.Logger, Registerer: cfg.Registerer})
		if err != nil {
			return nil, err // not a nil *xrc.Transport in an interface
		}
		return t, nil
	}
	t, err := rc.New(rc.Config{Device: dev, Rank: env.Rank, Nodes: nodes, Kick: kick, Lazy: f.lazy, Bootstrap: boot,
		Logger: cfg.Logger, Registerer: cfg.Registerer})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// A rank's record in the all-gather is its transports' records, each
// preceded by its length (u32).
func joinRecords(recs ...[]byte) []byte {
	var b []byte
	for _, r := range recs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(r)))
		b = append(b, r...)
	}
	return b
}

func splitRecords(b []byte, n int) ([][]byte, error) {
	out := make([][]byte, 0, n)
	for range n {
		if len(b) < 4 || uint64(binary.LittleEndian.Uint32(b)) > uint64(len(b)-4) {
			return nil, fmt.Errorf("comm: malformed record of %d bytes", len(b))
		}
		k := binary.LittleEndian.Uint32(b)
		out = append(out, b[4:4+k])
		b = b[4+k:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("comm: %d bytes after the records", len(b))
	}
	return out, nil
}
