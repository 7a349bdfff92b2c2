package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/xrcrun/xrc/softhca"
)

// runHCA runs a software HCA as a service until ctx ends (SIGINT or
// SIGTERM): the device speaks RoCEv2 on addr:4791 and serves the processes
// of this machine through its socket in the runtime directory.
func runHCA(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("xrcrun hca", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		name    = fs.String("name", "", "device `name` (required), as verbs lists it")
		addr    = fs.String("addr", "", "the port's IP `address` (required): RoCEv2 uses UDP port 4791 on it, and the GID derives from it")
		dir     = fs.String("dir", "", "runtime `directory` of the device socket (default: $"+softhca.RuntimeDirEnv+", else $XDG_RUNTIME_DIR/xrc, else $TMPDIR/xrc-UID, TMPDIR defaulting to /tmp)") // "": Serve takes softhca.RuntimeDir()
		mtu     = fs.Int("mtu", 4096, "port MTU: 256, 512, 1024, 2048 or 4096")
		spin    = fs.Duration("spin", softhca.ProcessSpinIdle, "how long the engine keeps polling for work before it sleeps, giving the CPU to any other runnable thread between polls (0: it sleeps at once)")
		loss    = fs.Float64("loss", 0, "fault injection: probability that a sent packet is dropped")
		dup     = fs.Float64("dup", 0, "fault injection: probability that a sent packet is duplicated")
		reorder = fs.Float64("reorder", 0, "fault injection: probability that a sent packet is held back behind the next")
		delay   = fs.Float64("delay", 0, "fault injection: probability that a sent packet is delayed by --delay-by")
		delayBy = fs.Duration("delay-by", time.Millisecond, "fault injection: how late a delayed packet is")
		seed    = fs.Uint64("seed", 1, "fault injection: seed of the random choices")
		metrics = fs.String("metrics", "", "serve Prometheus metrics at http://`addr`/metrics")
		procs   = fs.Int("procs", 1, "GOMAXPROCS of the device process: its engine is one goroutine, and with one P the Go scheduler wakes no idle thread each time the engine wakes or sleeps")
		verbose = fs.Bool("v", false, "log every command, dropped packet and retransmission timeout")
	)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: xrcrun hca --name NAME --addr IP [flags]")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("hca: unexpected argument %q", fs.Arg(0))
	}
	if *name == "" || *addr == "" {
		fs.Usage()
		return errors.New("hca: --name and --addr are required")
	}
	ip, err := netip.ParseAddr(*addr)
	if err != nil {
		return fmt.Errorf("hca: --addr: %w", err)
	}
	faults := softhca.Faults{Loss: *loss, Duplicate: *dup, Reorder: *reorder, Delay: *delay, DelayBy: *delayBy, Seed: *seed}
	if err := checkFaults(faults); err != nil {
		return fmt.Errorf("hca: %w", err)
	}
	if *procs > 0 {
		runtime.GOMAXPROCS(*procs)
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	reg := prometheus.NewRegistry()
	if *spin <= 0 {
		*spin = -1 // softhca's "never"
	}
	d, err := softhca.New(ctx, softhca.Config{
		Name: *name, Addr: ip, UDP: true, MTU: *mtu, SpinIdle: *spin, SpinYield: true, Logger: log, Registerer: reg,
		Faults: faults,
	})
	if err != nil {
		return err
	}
	defer d.Close()
	if *metrics != "" {
		ln, err := net.Listen("tcp", *metrics)
		if err != nil {
			return fmt.Errorf("hca: metrics: %w", err)
		}
		srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		log.Info("metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	}
	log.Info("device up", "name", *name, "addr", ip, "mtu", *mtu)
	return d.Serve(ctx, *dir)
}

// checkFaults refuses a fault probability outside 0 to 1 (NaN included):
// above 1 the device dropped every packet, below 0 none, and a NaN could
// not be sent to the node agents.
func checkFaults(f softhca.Faults) error {
	for _, p := range []struct {
		flag string
		v    float64
	}{{"--loss", f.Loss}, {"--dup", f.Duplicate}, {"--reorder", f.Reorder}, {"--delay", f.Delay}} {
		if !(p.v >= 0 && p.v <= 1) {
			return fmt.Errorf("%s %v: a probability, 0 to 1", p.flag, p.v)
		}
	}
	if f.DelayBy < 0 {
		return fmt.Errorf("--delay-by %v: must not be negative", f.DelayBy)
	}
	return nil
}
