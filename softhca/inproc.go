//go:build linux

package softhca

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/mlx4"
	"github.com/xrcrun/xrc/verbs"
)

// Open connects a new client to the device from this process and returns
// it as a verbs context, driven by the mlx4 provider exactly as a kernel
// device would be.
func (d *Device) Open(cfg verbs.Config) (*verbs.Context, error) {
	p, err := d.provider()
	if err != nil {
		return nil, err
	}
	return verbs.NewContext(d.name, p, cfg), nil
}

// provider connects a client and opens the mlx4 provider on it.
func (d *Device) provider() (*mlx4.Context, error) {
	k, err := d.Kernel()
	if err != nil {
		return nil, err
	}
	p, err := mlx4.Open(k)
	if err != nil {
		k.Close()
		return nil, fmt.Errorf("open %s: %w", d.name, err)
	}
	return p, nil
}

// Kernel connects a new client from this process and returns it as the
// kernel side the mlx4 provider talks to.
func (d *Device) Kernel() (mlx4.Kernel, error) {
	mem := newLocalMemory()
	mem.noViews = d.noViews
	c, err := d.connect(mem)
	if err != nil {
		return nil, err
	}
	return &localKernel{d: d, c: c, mem: mem}, nil
}

// localKernel is a client of a device in the same process.
type localKernel struct {
	d   *Device
	c   *Client
	mem *localMemory
}

func (k *localKernel) Name() string                  { return k.d.name }
func (k *localKernel) Write(cmd []byte) (int, error) { return k.c.Write(cmd) }
func (k *localKernel) Close() error                  { return k.c.Close() }

// Yield lets the device's engine run when a poller finds nothing: the
// engine is a goroutine on the same CPUs.
func (k *localKernel) Yield() { runtime.Gosched() }

// PacksQueues: the device reads queues at any 64-byte-aligned address and
// fetches a send WQE only once it is posted (mlx4.Packer).
func (k *localKernel) PacksQueues() bool { return true }

func (k *localKernel) MapUAR() (mlx4.UAR, error) { return &localUAR{e: k.d.eng, c: k.c}, nil }

// AllocQueue maps memory and shares it with the device.
func (k *localKernel) AllocQueue(n int) ([]byte, error) {
	b, err := unix.MmapAnon(n)
	if err != nil {
		return nil, err
	}
	k.mem.addQueue(uint64(unix.AddrOf(b)), b)
	return b, nil
}

// FreeQueue stops sharing and unmaps. The provider frees queue memory only
// after the device has destroyed the queue that used it.
func (k *localKernel) FreeQueue(b []byte) error {
	if _, ok := k.mem.removeQueue(uint64(unix.AddrOf(b))); !ok {
		return unix.Error(unix.EINVAL, "free of memory that is not a queue")
	}
	return unix.Munmap(b)
}

func (k *localKernel) EventFile(fd int32, name string) (*os.File, error) {
	if err := unix.SetNonblock(int(fd)); err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), k.d.name+"-"+name), nil
}

func (k *localKernel) QueryGID(port uint8, index int) (verbs.GID, error) {
	if port != 1 || index != 0 {
		return verbs.GID{}, unix.Errorf(unix.EINVAL, "gid %d of port %d", index, port)
	}
	return k.d.gid, nil
}

// localUAR is the doorbell page of an in-process client: writes go straight
// to the engine's queue.
type localUAR struct {
	e *engine
	c *Client
}

func (u *localUAR) Write32(off int, v uint32) { u.e.ring(u.c, off, uint64(v)) }
func (u *localUAR) Write64(off int, v uint64) { u.e.ring(u.c, off, v) }
func (u *localUAR) Close() error              { return nil }

// The devices of this process, for the "soft" verbs driver.
var local struct {
	mu      sync.Mutex
	devices []*Device
}

func registerLocal(d *Device) {
	local.mu.Lock()
	local.devices = append(local.devices, d)
	local.mu.Unlock()
}

func unregisterLocal(d *Device) {
	local.mu.Lock()
	local.devices = slices.DeleteFunc(local.devices, func(x *Device) bool { return x == d })
	local.mu.Unlock()
}

func init() { verbs.RegisterDriver(softDriver{}) }

// softDriver lists software HCAs: the devices of this process, then the
// device services whose sockets are in RuntimeDir().
type softDriver struct{}

func (softDriver) Name() string { return "soft" }

func (softDriver) Devices(ctx context.Context) ([]verbs.DeviceInfo, error) {
	local.mu.Lock()
	var out []verbs.DeviceInfo
	seen := map[string]bool{}
	for _, d := range local.devices {
		out = append(out, verbs.DeviceInfo{Name: d.name, Driver: "soft", NodeGUID: d.guid, Transport: "software"})
		seen[d.name] = true
	}
	local.mu.Unlock()
	names, err := serviceNames(RuntimeDir())
	if err != nil {
		return out, fmt.Errorf("softhca: list %s: %w", RuntimeDir(), err)
	}
	if _, ok := ctx.Deadline(); !ok {
		// A device that accepted and never answers (stopped) must not
		// hang a caller that set no bound.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, listWait)
		defer cancel()
	}
	// The services are asked together, so that one that does not answer
	// costs the listing one wait, not one each.
	names = slices.DeleteFunc(names, func(n string) bool { return seen[n] })
	infos := make([]deviceInfo, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Go(func() { infos[i], errs[i] = serviceInfo(ctx, "", n) })
	}
	wg.Wait()
	for i, n := range names {
		switch err := errs[i]; {
		case errors.Is(err, verbs.ErrNoDevice):
			errs[i] = nil // a socket left by a device that died: refused at once
		case err != nil:
			// A device is there but did not answer (in time): say so,
			// rather than list it as gone.
			errs[i] = fmt.Errorf("softhca: device %s: %w", n, err)
		default:
			out = append(out, verbs.DeviceInfo{Name: infos[i].name, Driver: "soft", NodeGUID: infos[i].guid, Transport: "software"})
		}
	}
	return out, errors.Join(errs...)
}

// listWait bounds a listing whose caller set no deadline: long enough for
// live devices on a loaded machine to answer, short enough that a stopped
// one does not hang it.
const listWait = 30 * time.Second

func (softDriver) Open(ctx context.Context, name string, cfg verbs.Config) (verbs.Provider, error) {
	local.mu.Lock()
	var d *Device
	for _, x := range local.devices {
		if x.name == name {
			d = x
		}
	}
	local.mu.Unlock()
	if d != nil {
		return d.provider()
	}
	k, err := Attach(ctx, "", name)
	if err != nil {
		return nil, err
	}
	p, err := mlx4.Open(k)
	if err != nil {
		k.Close()
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	return p, nil
}
