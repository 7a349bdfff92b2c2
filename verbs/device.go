package verbs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
)

// DeviceInfo describes a device a driver found.
type DeviceInfo struct {
	Name     string // "mlx4_0", "soft0"
	Driver   string // the driver that opens it
	NodeGUID uint64
	// Transport is "InfiniBand" for HCAs driven through the kernel and
	// "software" for software HCAs.
	Transport string
	// Path locates the device: its uverbs character device or the software
	// HCA's socket; empty for an in-process device.
	Path string
}

// Config holds what a device's user supplies.
type Config struct {
	// Logger receives the device's logs; nil discards them.
	Logger *slog.Logger
}

func (c Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

var drivers struct {
	mu   sync.Mutex
	list []Driver
}

// RegisterDriver makes a driver's devices visible to Devices and Open. It
// panics if a driver of the same name is already registered.
func RegisterDriver(d Driver) {
	drivers.mu.Lock()
	defer drivers.mu.Unlock()
	for _, o := range drivers.list {
		if o.Name() == d.Name() {
			panic("verbs: driver " + d.Name() + " registered twice")
		}
	}
	drivers.list = append(drivers.list, d)
}

func registered() []Driver {
	drivers.mu.Lock()
	defer drivers.mu.Unlock()
	return slices.Clone(drivers.list)
}

// Devices lists the devices of every registered driver, sorted by name.
// Drivers register when their package is imported: hardware through
// github.com/xrcrun/xrc/mlx4, software HCAs through
// github.com/xrcrun/xrc/softhca. A driver that fails to list its devices is
// reported in the error, joined with the others'; the devices found are still
// returned. ctx bounds what a driver waits for: a device that has not
// answered when it ends is left out and reported in the error.
func Devices(ctx context.Context) ([]DeviceInfo, error) {
	var all []DeviceInfo
	var errs []error
	for _, d := range registered() {
		devs, err := d.Devices(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s devices: %w", d.Name(), err))
		}
		all = append(all, devs...)
	}
	slices.SortFunc(all, func(a, b DeviceInfo) int { return cmp.Compare(a.Name, b.Name) })
	return all, errors.Join(errs...)
}

// ErrNoDevice is returned by Open for a name no driver knows.
var ErrNoDevice = errors.New("no such RDMA device")

// Open opens the named device: each registered driver is asked in turn,
// without listing the devices, so that a device service that does not
// answer holds up only those who open it. An empty name opens the first
// device listed.
func Open(ctx context.Context, name string, cfg Config) (*Context, error) {
	if name != "" {
		for _, d := range registered() {
			p, err := d.Open(ctx, name, cfg)
			if err == nil {
				return NewContext(name, p, cfg), nil
			}
			if !errors.Is(err, ErrNoDevice) {
				return nil, fmt.Errorf("open %s: %w", name, err)
			}
		}
		return nil, fmt.Errorf("open %s: %w", name, ErrNoDevice)
	}
	devs, err := Devices(ctx)
	if len(devs) == 0 && err != nil {
		return nil, err
	}
	for _, dev := range devs {
		for _, d := range registered() {
			if d.Name() != dev.Driver {
				continue
			}
			p, err := d.Open(ctx, dev.Name, cfg)
			if err != nil {
				return nil, fmt.Errorf("open %s: %w", dev.Name, err)
			}
			return NewContext(dev.Name, p, cfg), nil
		}
	}
	return nil, fmt.Errorf("open: %w", ErrNoDevice)
}
