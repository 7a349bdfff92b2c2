package mlx4

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/verbs"
)

// The kernel backend: a real ConnectX-3 HCA through /dev/infiniband/uverbsN,
// driven by the kernel's mlx4_ib module. The commands are written to the
// uverbs file, the doorbell page is mapped from it, and queues live in
// ordinary memory that the kernel pins.

const (
	sysfsIB     = "/sys/class/infiniband"
	sysfsVerbs  = "/sys/class/infiniband_verbs"
	devUverbs   = "/dev/infiniband"
	driverName  = "mlx4"
	mlx4KDriver = "mlx4_core"
)

func init() { verbs.RegisterDriver(uverbsDriver{}) }

// uverbsDriver lists and opens mlx4 HCAs known to the kernel.
type uverbsDriver struct{}

func (uverbsDriver) Name() string { return driverName }

// Devices lists the kernel's mlx4 devices. A machine without RDMA devices
// has no /sys/class/infiniband: that is an empty list, not an error.
func (uverbsDriver) Devices(context.Context) ([]verbs.DeviceInfo, error) {
	ents, err := os.ReadDir(sysfsIB)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []verbs.DeviceInfo
	for _, e := range ents {
		name := e.Name()
		if !isMLX4(name) {
			continue
		}
		path, err := uverbsPath(name)
		if err != nil {
			continue
		}
		guid, _ := readGUID(filepath.Join(sysfsIB, name, "node_guid"))
		out = append(out, verbs.DeviceInfo{Name: name, Driver: driverName, NodeGUID: guid, Transport: "InfiniBand", Path: path})
	}
	return out, nil
}

// isMLX4 reports whether the kernel's IB device name is an mlx4 HCA.
func isMLX4(name string) bool {
	if _, err := os.Stat(filepath.Join(sysfsIB, name)); err != nil {
		return false
	}
	drv, _ := os.Readlink(filepath.Join(sysfsIB, name, "device", "driver"))
	return filepath.Base(drv) == mlx4KDriver || strings.HasPrefix(name, "mlx4_")
}

// Open opens the kernel's mlx4 device name; a name that is not one is
// verbs.ErrNoDevice, so that verbs.Open asks the next driver.
func (uverbsDriver) Open(ctx context.Context, name string, cfg verbs.Config) (verbs.Provider, error) {
	if !isMLX4(name) {
		return nil, fmt.Errorf("mlx4: no kernel mlx4 device %s: %w", name, verbs.ErrNoDevice)
	}
	k, err := OpenUverbs(name)
	if err != nil {
		return nil, err
	}
	p, err := Open(k)
	if err != nil {
		k.Close()
		return nil, err
	}
	return p, nil
}

// uverbsPath finds the character device of an IB device.
func uverbsPath(ibdev string) (string, error) {
	ents, err := os.ReadDir(sysfsVerbs)
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(sysfsVerbs, e.Name(), "ibdev"))
		if err == nil && strings.TrimSpace(string(b)) == ibdev {
			return filepath.Join(devUverbs, e.Name()), nil
		}
	}
	return "", fmt.Errorf("no uverbs device for %s", ibdev)
}

func readGUID(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.ReplaceAll(strings.TrimSpace(string(b)), ":", ""), 16, 64)
}

// UverbsKernel is the kernel's uverbs file of one device.
type UverbsKernel struct {
	name string
	fd   int
}

// OpenUverbs opens the uverbs file of the named device, after checking the
// kernel's uverbs ABI version.
func OpenUverbs(name string) (*UverbsKernel, error) {
	b, err := os.ReadFile(filepath.Join(sysfsVerbs, "abi_version"))
	if err != nil {
		return nil, fmt.Errorf("read uverbs abi version: %w", err)
	}
	if v, _ := strconv.Atoi(strings.TrimSpace(string(b))); v != 6 {
		return nil, fmt.Errorf("kernel uverbs ABI %d, need 6: %w", v, verbs.ErrNotSupported)
	}
	path, err := uverbsPath(name)
	if err != nil {
		return nil, err
	}
	fd, err := unix.OpenRDWR(path)
	if err != nil {
		return nil, err
	}
	return &UverbsKernel{name: name, fd: fd}, nil
}

func (k *UverbsKernel) Name() string { return k.name }

// Write issues a command with write(2).
func (k *UverbsKernel) Write(cmd []byte) (int, error) { return unix.Write(k.fd, cmd) }

// MapUAR maps the doorbell page (offset 0 of the uverbs file).
func (k *UverbsKernel) MapUAR() (UAR, error) {
	b, err := unix.MmapShared(k.fd, 0, unix.PageSize)
	if err != nil {
		return nil, err
	}
	return &mmioUAR{page: b}, nil
}

// AllocQueue returns anonymous memory; the kernel pins it at create time.
func (k *UverbsKernel) AllocQueue(n int) ([]byte, error) { return unix.MmapAnon(n) }

// FreeQueue unmaps queue memory.
func (k *UverbsKernel) FreeQueue(b []byte) error { return unix.Munmap(b) }

// EventFile wraps a kernel event file descriptor.
func (k *UverbsKernel) EventFile(fd int32, name string) (*os.File, error) {
	if err := unix.SetNonblock(int(fd)); err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), k.name+"-"+name), nil
}

// QueryGID reads a GID from sysfs.
func (k *UverbsKernel) QueryGID(port uint8, index int) (verbs.GID, error) {
	b, err := os.ReadFile(filepath.Join(sysfsIB, k.name, "ports", strconv.Itoa(int(port)), "gids", strconv.Itoa(index)))
	if err != nil {
		return verbs.GID{}, err
	}
	a, err := netip.ParseAddr(strings.TrimSpace(string(b)))
	if err != nil {
		return verbs.GID{}, fmt.Errorf("parse gid: %w", err)
	}
	return verbs.GID(a.As16()), nil
}

// Close closes the uverbs file; the kernel destroys what is left.
func (k *UverbsKernel) Close() error { return unix.Close(k.fd) }

// mmioUAR writes doorbells to the mapped device page with single stores.
type mmioUAR struct{ page []byte }

func (u *mmioUAR) Write32(off int, v uint32) {
	p := (*uint32)(unsafe.Pointer(&u.page[off]))
	*p = mlx4hw.NativeBE32(v)
}

func (u *mmioUAR) Write64(off int, v uint64) {
	p := (*uint64)(unsafe.Pointer(&u.page[off]))
	*p = mlx4hw.NativeBE64(v)
}

func (u *mmioUAR) Close() error { return unix.Munmap(u.page) }
