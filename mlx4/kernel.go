//go:build linux

package mlx4

import (
	"os"

	"github.com/xrcrun/xrc/verbs"
)

// Kernel is the device's kernel side as the provider sees it: the uverbs
// command file, the doorbell page, and the memory queues live in. Two
// implementations exist: the kernel's /dev/infiniband/uverbsN for real
// ConnectX-3 HCAs (OpenUverbs), and a software HCA's client (package
// softhca), which takes the same command bytes.
type Kernel interface {
	// Write executes one uverbs write command, as write(2) on the uverbs
	// file does: it returns len(cmd), or an error wrapping the errno. The
	// device writes the response where the command's response field says.
	Write(cmd []byte) (int, error)
	// MapUAR maps the context's user access region (the doorbell page).
	// It is called once, after GET_CONTEXT.
	MapUAR() (UAR, error)
	// AllocQueue returns n bytes (a multiple of the page size) of zeroed,
	// page-aligned memory that the device can reach, for queue buffers and
	// doorbell records. The memory is the provider's until FreeQueue.
	AllocQueue(n int) ([]byte, error)
	// FreeQueue releases memory from AllocQueue.
	FreeQueue(b []byte) error
	// EventFile turns an event file descriptor that a command returned
	// (GET_CONTEXT's async_fd, CREATE_COMP_CHANNEL's fd) into a pollable
	// file. The caller owns the file.
	EventFile(fd int32, name string) (*os.File, error)
	// QueryGID returns a port's GID at index.
	QueryGID(port uint8, index int) (verbs.GID, error)
	// Name is the device's name.
	Name() string
	// Close closes the command file.
	Close() error
}

// Yielder is implemented by a Kernel whose device shares the CPUs with its
// users: a software HCA, in this process or another. Poll calls Yield when
// it finds a CQ empty, so that a caller spinning on Poll lets the device
// make progress. Hardware needs no such thing.
type Yielder interface {
	Yield()
}

// Packer is implemented by a Kernel whose device (a software HCA) reads a
// queue buffer at any 64-byte-aligned address and fetches a send WQE only
// once its owner bit says it was posted, never ahead of that. When
// PacksQueues is true, the provider packs queue buffers of at most half a
// page several to a page, and keeps no headroom in a send queue: it asks
// the device for no prefetch (sq_no_prefetch) and stamps nothing. A QP of
// a few send slots then takes a fraction of a page instead of a page of
// its own, and with thousands of QPs a message touches one page less (on
// a virtual machine each distinct page can cost a nested page walk; see
// docs/benchmarks.md). rdma-core's provider does neither, as a ConnectX-3
// prefetches WQEs and maps queues by the page, and neither does this one
// for hardware (OpenUverbs).
type Packer interface {
	PacksQueues() bool
}

// UAR is a mapped doorbell page. Writes are posted to the device in program
// order.
type UAR interface {
	// Write32 writes v big-endian at offset off.
	Write32(off int, v uint32)
	// Write64 writes v big-endian at offset off, as one access.
	Write64(off int, v uint64)
	// Close unmaps the page.
	Close() error
}

// RegionSharer is implemented by a Kernel whose device runs in another
// process and can map memory that this process shares with it. RegMR calls
// ShareRegion before it registers [addr, addr+n); a region the kernel
// cannot share is registered all the same, and reached another way.
type RegionSharer interface {
	ShareRegion(addr uintptr, n uint64) error
}
