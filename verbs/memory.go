package verbs

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"syscall"

	"github.com/xrcrun/xrc/internal/unix"
)

// Memory for registration comes in two kinds:
//
//   - Alloc returns page-aligned memory mapped outside the Go heap. It is what
//     large or long-lived buffers should use; Free unmaps it, and fails with
//     EBUSY while a memory region still covers it.
//   - Any Go slice can be registered too: RegMR pins its backing array with a
//     runtime.Pinner until the region is closed.

// allocation is one mapping made by Alloc.
type allocation struct {
	base uintptr
	b    []byte
	regs int // guarded by allocs.mu: live memory regions inside it
}

var allocs struct {
	mu   sync.Mutex
	list []*allocation // sorted by base
}

// Alloc maps n bytes of zeroed, page-aligned memory outside the Go heap.
func Alloc(n int) ([]byte, error) {
	b, err := unix.MmapAnon(n)
	if err != nil {
		return nil, fmt.Errorf("alloc %d bytes: %w", n, err)
	}
	a := &allocation{base: unix.AddrOf(b), b: b}
	allocs.mu.Lock()
	i, _ := slices.BinarySearchFunc(allocs.list, a.base, func(x *allocation, base uintptr) int {
		return cmp.Compare(x.base, base)
	})
	allocs.list = slices.Insert(allocs.list, i, a)
	allocs.mu.Unlock()
	return b, nil
}

// Free unmaps memory returned by Alloc. It fails with an error wrapping
// EBUSY while a memory region covers it, and with EINVAL for memory Alloc
// did not return.
func Free(b []byte) error {
	base := unix.AddrOf(b)
	allocs.mu.Lock()
	defer allocs.mu.Unlock()
	i, ok := slices.BinarySearchFunc(allocs.list, base, func(x *allocation, base uintptr) int {
		return cmp.Compare(x.base, base)
	})
	if !ok {
		return fmt.Errorf("free: memory not from Alloc: %w", syscall.EINVAL)
	}
	a := allocs.list[i]
	if a.regs > 0 {
		return fmt.Errorf("free: %d memory regions still registered: %w", a.regs, syscall.EBUSY)
	}
	allocs.list = slices.Delete(allocs.list, i, i+1)
	return unix.Munmap(a.b)
}

// holdAlloc finds the Alloc mapping containing [addr, addr+n) and counts a
// registration in it; it returns nil for memory from elsewhere.
func holdAlloc(addr uintptr, n uint64) *allocation {
	allocs.mu.Lock()
	defer allocs.mu.Unlock()
	i, found := slices.BinarySearchFunc(allocs.list, addr, func(x *allocation, base uintptr) int {
		return cmp.Compare(x.base, base)
	})
	if !found {
		i--
	}
	if i < 0 {
		return nil
	}
	a := allocs.list[i]
	if addr < a.base || uint64(addr-a.base)+n > uint64(len(a.b)) {
		return nil
	}
	a.regs++
	return a
}

func (a *allocation) release() {
	allocs.mu.Lock()
	a.regs--
	allocs.mu.Unlock()
}
