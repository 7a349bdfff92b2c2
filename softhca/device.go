//go:build linux

// Package softhca is a software HCA: a device that behaves like a
// ConnectX-3 (mlx4) adapter and the kernel driver above it, so that the
// mlx4 provider, and everything built on verbs, runs on machines without
// RDMA hardware.
//
// A Device takes the same uverbs command bytes the kernel's uverbs file
// would, keeps handles and objects per client, validates like the kernel
// (returning the errno the kernel would), executes WQEs from the queue
// buffers the provider writes, moves data between registered memory regions
// with key, bounds, access and PD checks, writes CQEs, raises async events,
// and destroys all of a client's objects when the client goes away.
//
// # Ownership
//
// Queue buffers and doorbell records belong to the client that allocated
// them; the device reads WQEs and doorbell records and writes CQEs into
// them for as long as the queue exists. Registered memory belongs to the
// client; the device reads and writes it only through a memory region, and
// only while a work request that names it is outstanding.
//
// # Threading
//
// Each device runs one engine goroutine that owns the data path: doorbells,
// incoming packets and timers are queued to it. Commands run on the caller's
// goroutine. Both take the device mutex, so the state of every object is
// changed by one goroutine at a time.
//
// # Debugging
//
// A device whose logger is enabled at debug level logs every command,
// every dropped packet and every retransmission timeout.
package softhca

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xrcrun/xrc/internal/qpstate"
)

// Config describes a device.
type Config struct {
	// Name is the device name, as verbs lists it ("soft0").
	Name string
	// Addr is the port's IP address; the port's GID is derived from it.
	Addr netip.Addr
	// Fabric joins the devices of this process that can reach each other;
	// nil gives the device a fabric of its own (it can still talk to
	// itself).
	Fabric *Fabric
	// UDP puts the device on the network instead of a fabric: it speaks
	// RoCEv2 on UDP port 4791 of Addr, to any device at any address.
	UDP bool
	// MTU is the port's MTU in bytes: 256, 512, 1024, 2048 or 4096
	// (default 4096).
	MTU int
	// SpinIdle is how long the engine keeps polling for work after its last
	// work before it sleeps (default 20µs; negative: never spin).
	SpinIdle time.Duration
	// SpinYield makes the engine give its CPU to any other runnable thread
	// (sched_yield) between the polls of its spin, not only to the other
	// goroutines of its process. A device process sets it: its engine is
	// the process's only work, and it shares the CPUs with its clients and
	// the other device processes, which a spin must not hold off. A device
	// in its clients' process leaves it unset: there the clients are
	// goroutines of the same process, and a system call per poll would
	// only slow them.
	SpinYield bool
	// Faults are injected into every packet the device sends (see also
	// SetLinkFaults).
	Faults Faults
	// Clock drives retransmission and RNR timers; nil is the real clock.
	Clock Clock
	// Logger receives the device's logs; nil discards them.
	Logger *slog.Logger
	// Registerer, when not nil, gets the device's counters and object
	// counts as Prometheus metrics (labeled with the device name); Close
	// unregisters them.
	Registerer prometheus.Registerer
}

// Limits the device reports and enforces.
const (
	maxQP          = 1 << 17
	maxQPWR        = 16384
	maxSGE         = 32
	maxCQ          = 1 << 16
	maxCQE         = 1<<22 - 1
	maxMR          = 1 << 20
	maxPD          = 1 << 16
	maxSRQ         = 1 << 16
	maxSRQWR       = 16383
	maxSRQSGE      = 31
	maxQPRdAtom    = 16
	maxQPInitRdAtm = 16
	maxMRSize      = 1 << 40
	maxInline      = 1024
	maxXRCD        = 1 << 16
	numCompVectors = 1
	firstQPN       = 0x48
)

// Device is a software HCA.
type Device struct {
	name  string
	addr  netip.Addr
	gid   [16]byte
	guid  uint64
	mtu   int
	maps  *mapBudget // the clients' memory the device maps (device processes)
	log   *slog.Logger
	debug bool
	clock Clock
	// noViews, a test hook, makes the device reach the memory regions of
	// clients in its own process with process_vm_readv/writev, as it
	// reaches other processes' (Go memory), instead of directly.
	noViews bool

	link    link
	eng     *engine
	reg     prometheus.Registerer
	stopCtx func() bool
	gone    chan struct{} // closed by Close
	portUp  atomic.Bool

	mu       sync.Mutex // guards everything below and the state of every object
	closed   bool
	clients  map[*Client]struct{}
	pds      map[uint32]*pd
	mrs      map[uint32]*mr // by key index (key >> 8)
	cqs      map[uint32]*cq
	srqs     map[uint32]*srq
	qps      qpTable
	xrcds    map[fileID]*xrcd // the domains opened from a file
	nXRCD    int              // domains, shared or not
	nextPDN  uint32
	nextMR   uint32
	keyTag   uint8
	nextCQN  uint32
	nextSRQ  uint32
	nextQPN  uint32
	nextXRCD uint32

	counters Counters
}

// maxNameLen bounds device names (IB_DEVICE_NAME_MAX is 64 with its NUL).
const maxNameLen = 63

// ErrClosed is returned for operations on a closed device.
var ErrClosed = errors.New("softhca: device closed")

// New creates a device and starts its engine. The device runs until Close,
// or until ctx is done.
func New(ctx context.Context, cfg Config) (*Device, error) {
	if cfg.Name == "" || len(cfg.Name) > maxNameLen || strings.ContainsAny(cfg.Name, "/\x00 \t\n") {
		return nil, fmt.Errorf("softhca: device name %q: 1 to %d characters, no slash or space", cfg.Name, maxNameLen)
	}
	if !cfg.Addr.IsValid() {
		return nil, errors.New("softhca: device needs an address")
	}
	if cfg.MTU == 0 {
		cfg.MTU = 4096
	}
	if mtuEnum(cfg.MTU) == 0 {
		return nil, fmt.Errorf("softhca: invalid MTU %d", cfg.MTU)
	}
	if cfg.SpinIdle == 0 {
		cfg.SpinIdle = 20 * time.Microsecond
	}
	if cfg.Clock == nil {
		cfg.Clock = newRealClock()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := fnv.New64a()
	h.Write([]byte(cfg.Name))
	h.Write(cfg.Addr.AsSlice())
	d := &Device{
		name: cfg.Name, addr: cfg.Addr, gid: cfg.Addr.As16(), guid: h.Sum64(),
		mtu: cfg.MTU, maps: newMapBudget(), log: log.With("device", cfg.Name), clock: cfg.Clock,
		debug:   log.Enabled(context.Background(), slog.LevelDebug),
		clients: map[*Client]struct{}{},
		pds:     map[uint32]*pd{}, mrs: map[uint32]*mr{}, cqs: map[uint32]*cq{},
		srqs:    map[uint32]*srq{},
		xrcds:   map[fileID]*xrcd{},
		nextPDN: 1, nextMR: 1, nextCQN: 1, nextSRQ: 1, nextQPN: firstQPN, nextXRCD: 1,
	}
	// The engine exists before the link, which may deliver at once; it
	// starts once the device is complete.
	d.portUp.Store(true)
	d.gone = make(chan struct{})
	d.eng = newEngine(d, cfg.SpinIdle, cfg.SpinYield, cfg.Faults)
	var err error
	switch {
	case cfg.UDP && cfg.Fabric != nil:
		return nil, errors.New("softhca: a device is on a fabric or on UDP, not both")
	case cfg.UDP:
		d.link, err = listenUDP(d)
	case cfg.Fabric != nil:
		d.link, err = cfg.Fabric.attach(d)
	default:
		d.link, err = NewFabric().attach(d)
	}
	if err != nil {
		return nil, err
	}
	if cfg.Registerer != nil {
		d.reg = cfg.Registerer
		if err := d.reg.Register(collector{d}); err != nil {
			d.link.close()
			return nil, fmt.Errorf("softhca: register metrics: %w", err)
		}
	}
	go d.eng.loop()
	registerLocal(d)
	d.stopCtx = context.AfterFunc(ctx, func() { d.Close() })
	return d, nil
}

// Name is the device name.
func (d *Device) Name() string { return d.name }

// GID is the port's GID.
func (d *Device) GID() [16]byte { return d.gid }

// NodeGUID is the device's node GUID.
func (d *Device) NodeGUID() uint64 { return d.guid }

// Close disconnects every client (destroying their objects), detaches the
// device from its fabric and stops the engine.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	close(d.gone)
	d.fail()
	clients := make([]*Client, 0, len(d.clients))
	for c := range d.clients {
		clients = append(clients, c)
	}
	d.mu.Unlock()
	var errs []error
	for _, c := range clients {
		errs = append(errs, c.Close())
	}
	unregisterLocal(d)
	d.eng.stop()
	errs = append(errs, d.link.close())
	if d.reg != nil {
		d.reg.Unregister(collector{d})
	}
	if d.stopCtx != nil {
		d.stopCtx()
	}
	return errors.Join(errs...)
}

// fail puts every QP in the error state, its posted work flushed, and tells
// every client that the device is gone (IBV_EVENT_DEVICE_FATAL), as a dying
// HCA does: clients in other processes, whose queues outlive the device,
// see their work complete with flush errors. Caller holds d.mu.
func (d *Device) fail() {
	for q := range d.qps.all {
		if q.state == qpstate.Reset || q.destroyed {
			continue
		}
		if q.state != qpstate.Err {
			d.setState(q, qpstate.Err)
		}
		d.flushPosted(q)
	}
	for c := range d.clients {
		c.asyncEvent(0, evDeviceFatal)
	}
}

// SetPortActive brings the port up or down, as a cable that is plugged in or
// pulled. A port that is down sends and receives nothing, and QUERY_PORT
// reports it DOWN. Every client gets a PORT_ACTIVE or PORT_ERR event.
func (d *Device) SetPortActive(up bool) {
	if d.portUp.Swap(up) == up {
		return
	}
	ev := uint32(evPortErr)
	if up {
		ev = evPortActive
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for c := range d.clients {
		c.asyncEvent(1, ev)
	}
}

// Objects counts a device's live objects.
type Objects struct {
	Clients, PDs, MRs, CQs, SRQs, QPs, XRCDs int
}

// Objects reports how many objects the device holds.
func (d *Device) Objects() Objects {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Objects{Clients: len(d.clients), PDs: len(d.pds), MRs: len(d.mrs), CQs: len(d.cqs),
		SRQs: len(d.srqs), QPs: d.qps.len(), XRCDs: d.nXRCD}
}

// mtuEnum converts an MTU in bytes to the IB enum (0 if invalid).
func mtuEnum(n int) uint8 {
	for e := uint8(1); e <= 5; e++ {
		if 128<<e == n {
			return e
		}
	}
	return 0
}

// ProcessSpinIdle is the SpinIdle of a device process (xrcrun hca, the
// devices xrcrun starts for emulated nodes): with SpinYield, a spin of this
// length bridges the gap between a client's completion and its next
// request, which otherwise costs a sleeping process a wake-up. It is
// longer than a round trip under contention: on a 2-CPU machine a device
// that shares its CPU with a polling client sees round trips of 50 to
// 150 µs, and one that slept through each paid an idle CPU's wake-up and
// its runtime's, which made the next round trip longer still. Against
// 50 µs, alternated eight times each (docs/benchmarks.md, "Device
// spin"), 1 ms took the median 8-byte SEND round trip between two device
// processes from 45.5 to 40.6 µs and the 1 MiB WRITE stream from 2.54 to
// 3.02 GB/s. A device with no work sleeps after it, and gives its CPU to
// any other runnable thread between polls until then.
const ProcessSpinIdle = time.Millisecond

// Clock is the time source of the device's timers.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine after d.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc.
type Timer interface {
	Stop() bool
	// Reset makes the timer call its function again after d.
	Reset(d time.Duration) bool
}

// realClock is the system's clock. Now reads only the monotonic clock:
// time.Now reads the wall clock as well, a second system clock read that
// costs as much again (about 25 ns on this project's test machine), and
// the engine reads the clock every round. Its times are base plus the
// monotonic time since, so a wall clock step after newRealClock does not
// show in them.
type realClock struct {
	base time.Time // with its monotonic reading
}

func newRealClock() realClock { return realClock{base: time.Now()} }

func (c realClock) Now() time.Time                          { return c.base.Add(time.Since(c.base)) }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
