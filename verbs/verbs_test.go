package verbs

import (
	"context"
	"errors"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// capsProvider is a provider that only answers QueryDevice: enough for the
// feature probes.
type capsProvider struct {
	Provider
	caps    DeviceCap
	queries int
	err     error
}

func (p *capsProvider) QueryDevice() (DeviceAttr, error) {
	p.queries++
	return DeviceAttr{DeviceCapFlags: p.caps}, p.err
}

func TestFeatureProbe(t *testing.T) {
	p := &capsProvider{}
	c := NewContext("fake0", p, Config{})
	err := c.Supports(FeatureSRQResize)
	var ufe *UnsupportedFeatureError
	if !errors.Is(err, ErrNotSupported) || !errors.As(err, &ufe) || ufe.Feature != FeatureSRQResize {
		t.Fatalf("probe without the capability: %v", err)
	}
	if c.Supports(FeatureSRQResize) == nil || p.queries != 1 {
		t.Fatalf("probe not cached: %d queries", p.queries)
	}
	p2 := &capsProvider{caps: DeviceCapSRQResize}
	if err := NewContext("fake1", p2, Config{}).Supports(FeatureSRQResize); err != nil {
		t.Fatalf("probe with the capability: %v", err)
	}
	// A device that cannot be queried is no verdict, and is not cached.
	p3 := &capsProvider{err: syscall.EIO}
	c3 := NewContext("fake2", p3, Config{})
	if err := c3.Supports(FeatureSRQResize); !errors.Is(err, syscall.EIO) || errors.Is(err, ErrNotSupported) {
		t.Fatalf("probe of a failing device: %v", err)
	}
	if err := c3.Supports(Feature(99)); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("unknown feature: %v", err)
	}
}

func TestAllocFree(t *testing.T) {
	b, err := Alloc(10000)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 10000 || uintptrOf(b)%uintptr(os.Getpagesize()) != 0 {
		t.Fatalf("Alloc: %d bytes at %#x", len(b), uintptrOf(b))
	}
	b[9999] = 1
	if a := holdAlloc(uintptrOf(b)+100, 9900); a == nil {
		t.Fatal("a range inside the allocation not found")
	} else {
		if err := Free(b); !errors.Is(err, syscall.EBUSY) {
			t.Fatalf("Free while registered: %v", err)
		}
		a.release()
	}
	if holdAlloc(uintptrOf(b)+100, uint64(cap(b))-99) != nil {
		t.Fatal("a range past the mapping found")
	}
	if err := Free(make([]byte, 10)); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("Free of Go memory: %v", err)
	}
	if err := Free(b); err != nil {
		t.Fatal(err)
	}
	if err := Free(b); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("double Free: %v", err)
	}

	// The bytes past len in the last page are mapped too, and a region
	// over them must keep Free from unmapping them.
	c, err := Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	a := holdAlloc(uintptrOf(c), uint64(cap(c)))
	if a == nil {
		t.Fatalf("a region over all %d mapped bytes of a 100-byte Alloc not counted", cap(c))
	}
	if err := Free(c); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("Free under a region past len: %v", err)
	}
	a.release()
	if err := Free(c); err != nil {
		t.Fatal(err)
	}
}

// TestOnFree: Free calls the hooks with the whole mapping before it looks
// for regions, so that a hook can release one and Free succeed; a removed
// hook is not called.
func TestOnFree(t *testing.T) {
	b, err := Alloc(10000)
	if err != nil {
		t.Fatal(err)
	}
	a := holdAlloc(uintptrOf(b)+100, 10) // a region a cache keeps
	var got [][]byte
	remove := OnFree(func(m []byte) {
		got = append(got, m)
		if a != nil {
			a.release()
			a = nil
		}
	})
	if err := Free(b[:100]); err != nil { // a slice of the mapping, from its start
		t.Fatalf("Free with a hook releasing the region: %v", err)
	}
	if len(got) != 1 || uintptrOf(got[0]) != uintptrOf(b) || len(got[0]) != 10000 {
		t.Fatalf("hook called with %d mappings (%v)", len(got), got)
	}
	remove()
	c, err := Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	if err := Free(c); err != nil || len(got) != 1 {
		t.Fatalf("Free after the hook's removal: %v, %d calls", err, len(got))
	}
}

type listDriver struct {
	name string
	devs []DeviceInfo
	err  error
}

func (d listDriver) Name() string                                  { return d.name }
func (d listDriver) Devices(context.Context) ([]DeviceInfo, error) { return d.devs, d.err }
func (d listDriver) Open(_ context.Context, name string, _ Config) (Provider, error) {
	for _, dev := range d.devs {
		if dev.Name == name {
			return nil, syscall.ENODEV // a device this test cannot open
		}
	}
	return nil, ErrNoDevice
}

// registerTestDriver registers d until the test ends, so that the test can
// run again in the same process (-count).
func registerTestDriver(t *testing.T, d Driver) {
	RegisterDriver(d)
	t.Cleanup(func() {
		drivers.mu.Lock()
		defer drivers.mu.Unlock()
		drivers.list = slices.DeleteFunc(drivers.list, func(o Driver) bool { return o.Name() == d.Name() })
	})
}

func TestDevices(t *testing.T) {
	registerTestDriver(t, listDriver{name: "test-a", devs: []DeviceInfo{{Name: "zz9", Driver: "test-a"}}})
	registerTestDriver(t, listDriver{name: "test-b", err: syscall.EACCES})
	devs, err := Devices(context.Background())
	if !errors.Is(err, syscall.EACCES) {
		t.Fatalf("a failing driver's error is not reported: %v", err)
	}
	found := false
	for _, d := range devs {
		found = found || d.Name == "zz9"
	}
	if !found {
		t.Fatalf("devices %v lack zz9", devs)
	}
	if _, err := Open(context.Background(), "zz9", Config{}); !errors.Is(err, syscall.ENODEV) {
		t.Fatalf("open: %v", err)
	}
	if _, err := Open(context.Background(), "nope", Config{}); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("open of an unknown device: %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("registering a driver twice did not panic")
		}
	}()
	RegisterDriver(listDriver{name: "test-a"})
}

// TestQPOpsFirst: ops is a QP's first field, where a provider that holds
// the QP (QPHome) lays it on the line its posting reads (mlx4's
// TestQPLayout counts on it).
func TestQPOpsFirst(t *testing.T) {
	if off := unsafe.Offsetof(QP{}.ops); off != 0 {
		t.Fatalf("QP.ops at offset %d, want 0", off)
	}
}

// stuckDriver's listing waits for its context, as a driver whose device
// service accepted and never answers; it opens no device.
type stuckDriver struct{}

func (stuckDriver) Name() string { return "test-stuck" }
func (stuckDriver) Devices(ctx context.Context) ([]DeviceInfo, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (stuckDriver) Open(context.Context, string, Config) (Provider, error) { return nil, ErrNoDevice }

// TestOpenByNameDoesNotList: opening a device by name asks the drivers
// for it and lists nothing, so that a device that never answers holds up
// only a listing (Open listed all devices first, and with a context that
// does not end waited for ever).
func TestOpenByNameDoesNotList(t *testing.T) {
	registerTestDriver(t, stuckDriver{})
	registerTestDriver(t, listDriver{name: "test-open", devs: []DeviceInfo{{Name: "zz8", Driver: "test-open"}}})
	done := make(chan error, 1)
	go func() {
		_, err := Open(context.Background(), "zz8", Config{})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, syscall.ENODEV) { // what listDriver's Open of zz8 says
			t.Fatalf("open zz8: %v, want the driver's own error", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Open by name still waiting a minute on, behind a driver's listing")
	}
}
