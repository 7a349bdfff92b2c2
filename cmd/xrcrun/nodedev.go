package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

// nodeDevice is the RDMA device the ranks of a node use: a kernel device of
// the host, or a soft HCA the agent runs.
type nodeDevice struct {
	name, addr string
	dir        string // the runtime directory ranks get
	close      func()
}

// setupDevice brings up node's device. Emulated nodes run a soft HCA on
// their loopback address. Other nodes use the host's first kernel RDMA
// device if it has one, else a soft HCA on the host's address.
func setupDevice(ctx context.Context, spec agentSpec, node int, log *slog.Logger) (*nodeDevice, error) {
	dir, releaseDir := spec.RuntimeDir, func() {}
	if dir != "" {
		// The launcher's: held while the node's device and ranks use it.
		var err error
		if releaseDir, err = holdTempDir(dir); err != nil {
			log.Warn("runtime directory not held against sweeps", "dir", dir, "err", err)
		}
	} else {
		d, remove, err := makeTempDir("xrcrun-" + spec.JobID + "-")
		if err != nil {
			return nil, fmt.Errorf("runtime directory: %w", err)
		}
		dir, releaseDir = d, remove
	}
	if !spec.Emulated {
		if name, ok := kernelDevice(ctx); ok {
			log.Info("using the host's RDMA device", "device", name)
			return &nodeDevice{name: name, dir: dir, close: releaseDir}, nil
		}
	}
	addrs, err := hcaAddrs(ctx, spec, node)
	if err != nil {
		releaseDir()
		return nil, err
	}
	name := fmt.Sprintf("soft-%s-%d", spec.JobID, node)
	for _, addr := range addrs {
		faults := spec.Faults
		faults.Seed += uint64(node)
		d, err := softhca.New(ctx, softhca.Config{Name: name, Addr: addr, UDP: true, SpinIdle: softhca.ProcessSpinIdle, SpinYield: true, Logger: log, Faults: faults})
		if errors.Is(err, syscall.EADDRINUSE) && len(addrs) > 1 {
			log.Debug("address in use", "addr", addr)
			continue
		}
		if err != nil {
			releaseDir()
			return nil, fmt.Errorf("soft HCA on %s: %w", addr, err)
		}
		if err := serveDevice(ctx, d, dir); err != nil {
			d.Close()
			releaseDir()
			return nil, err
		}
		log.Debug("soft HCA up", "device", name, "addr", addr, "dir", dir)
		return &nodeDevice{name: name, addr: addr.String(), dir: dir, close: func() { d.Close(); releaseDir() }}, nil
	}
	releaseDir()
	return nil, fmt.Errorf("soft HCA: UDP port 4791 is taken on every address tried (%s first)", addrs[0])
}

// serveDevice runs d's service in dir and returns once processes can
// attach.
func serveDevice(ctx context.Context, d *softhca.Device, dir string) error {
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, dir) }()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := softhca.QueryCounters(ctx, dir, d.Name()); err == nil {
			return nil
		}
		select {
		case err := <-served:
			return fmt.Errorf("soft HCA %s: serve: %w", d.Name(), err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("soft HCA %s does not serve after 30 s", d.Name())
		}
	}
}

// kernelDevice returns the name of the host's first RDMA device driven by
// the kernel (verbs lists them from sysfs).
func kernelDevice(ctx context.Context) (string, bool) {
	devs, _ := verbs.Devices(ctx)
	for _, d := range devs {
		if d.Transport == "InfiniBand" { // a kernel device, not a soft HCA's service
			return d.Name, true
		}
	}
	return "", false
}

// hcaAddrs lists the addresses to try for node's soft HCA, best first: the
// launcher's choice, or the host's address; with AddrFallback or a
// loopback address, random loopback addresses after it, so that jobs on one
// machine never collide.
func hcaAddrs(ctx context.Context, spec agentSpec, node int) ([]netip.Addr, error) {
	at := spec.At
	var first netip.Addr
	switch {
	case at.Addr != "":
		a, err := netip.ParseAddr(at.Addr)
		if err != nil {
			return nil, fmt.Errorf("node address: %w", err)
		}
		first = a
	case at.Host != "":
		a, err := hostAddr(ctx, at.Host)
		if err != nil {
			return nil, err
		}
		first = a
	default:
		first = netip.AddrFrom4([4]byte{127, 0, 1, byte(1 + node%254)})
	}
	addrs := []netip.Addr{first}
	// A host named by a loopback address is this machine, where any
	// loopback address does as well, and where other jobs may hold it.
	if spec.AddrFallback || (at.Addr == "" && first.IsLoopback()) {
		for range 64 {
			addrs = append(addrs, randomLoopback())
		}
	}
	return addrs, nil
}

// randomLoopback picks an address of 127.128.0.0/9, away from the
// 127.0.x.y that people use by hand and the 127.64/10 of softhca's tests.
func randomLoopback() netip.Addr {
	return netip.AddrFrom4([4]byte{127, 128 + byte(rand.IntN(128)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
}

// hostAddr resolves host to the IPv4 address its soft HCA binds.
func hostAddr(ctx context.Context, host string) (netip.Addr, error) {
	if _, h, ok := strings.Cut(host, "@"); ok { // user@host, as ssh takes it
		host = h
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
	if err != nil || len(addrs) == 0 {
		return netip.Addr{}, fmt.Errorf("resolve %s for its soft HCA: %v", host, err)
	}
	return addrs[0], nil
}
