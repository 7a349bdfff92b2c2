package verbs

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"syscall"

	"github.com/xrcrun/xrc/internal/unix"
)

// Memory for registration comes in two kinds:
//
//   - Alloc returns page-aligned memory mapped outside the Go heap. It is what
//     large or long-lived buffers should use; Free unmaps it, and fails with
//     EBUSY while a memory region still covers it. The memory is a memfd's,
//     so that a device in another process (a software HCA) can map it too
//     and move data with plain copies (AllocFile). A cache of
//     registrations hooks Free (OnFree) to close the regions it keeps.
//   - Any Go slice can be registered too: RegMR pins its backing array with a
//     runtime.Pinner until the region is closed.

// allocation is one mapping made by Alloc.
type allocation struct {
	base uintptr
	b    []byte
	fd   int // the memfd the mapping is of
	regs int // guarded by allocs.mu: live memory regions inside it
}

var allocs struct {
	mu   sync.Mutex
	list []*allocation // sorted by base
}

// Alloc maps n bytes of zeroed, page-aligned memory outside the Go heap.
func Alloc(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("alloc %d bytes: %w", n, syscall.EINVAL)
	}
	fd, b, err := unix.Memfd("xrc-alloc", n)
	if err != nil {
		return nil, fmt.Errorf("alloc %d bytes: %w", n, err)
	}
	a := &allocation{base: unix.AddrOf(b), b: b, fd: fd}
	allocs.mu.Lock()
	i, _ := slices.BinarySearchFunc(allocs.list, a.base, byBase)
	allocs.list = slices.Insert(allocs.list, i, a)
	allocs.mu.Unlock()
	return b, nil
}

// Free unmaps memory returned by Alloc. It first calls the hooks of
// OnFree, so that caches of registrations let go of the unused regions
// they keep in it; then it fails with an error wrapping EBUSY if a memory
// region still covers it, and with EINVAL for memory Alloc did not return
// (or that was freed already).
func Free(b []byte) error {
	base := unix.AddrOf(b)
	allocs.mu.Lock()
	a, ok := allocAt(base)
	allocs.mu.Unlock()
	if !ok {
		return fmt.Errorf("free: memory not from Alloc: %w", syscall.EINVAL)
	}
	frees.mu.Lock()
	hooks := slices.Collect(maps.Values(frees.hooks))
	frees.mu.Unlock()
	for _, f := range hooks {
		f(a.b)
	}
	allocs.mu.Lock()
	defer allocs.mu.Unlock()
	i := slices.Index(allocs.list, a)
	if i < 0 {
		return fmt.Errorf("free: memory not from Alloc (freed meanwhile): %w", syscall.EINVAL)
	}
	if a.regs > 0 {
		return fmt.Errorf("free: %d memory regions still registered: %w", a.regs, syscall.EBUSY)
	}
	allocs.list = slices.Delete(allocs.list, i, i+1)
	return errors.Join(unix.Munmap(a.b), unix.Close(a.fd))
}

// byBase orders allocations by their base address, for searches of
// allocs.list.
func byBase(x *allocation, base uintptr) int { return cmp.Compare(x.base, base) }

// allocAt finds the Alloc mapping that starts at base. Caller holds
// allocs.mu.
func allocAt(base uintptr) (*allocation, bool) {
	i, ok := slices.BinarySearchFunc(allocs.list, base, byBase)
	if !ok {
		return nil, false
	}
	return allocs.list[i], true
}

// frees holds the hooks of OnFree.
var frees struct {
	mu    sync.Mutex
	next  int
	hooks map[int]func([]byte)
}

// OnFree has f called with the memory Free is about to unmap (all of an
// Alloc mapping), before Free looks for memory regions that still cover
// it. It is for caches of registrations, which keep regions of memory the
// program no longer uses open so that a buffer used again is not
// registered again (as MPI libraries do, and the transports' RegCache):
// f closes the unused regions it keeps in b, so that Free can succeed. f
// runs on the goroutine calling Free, with no lock of this package held;
// it must not call Free. The returned function removes the hook; a Free
// already under way may still call f after it returned.
func OnFree(f func(b []byte)) (remove func()) {
	frees.mu.Lock()
	defer frees.mu.Unlock()
	if frees.hooks == nil {
		frees.hooks = map[int]func([]byte){}
	}
	id := frees.next
	frees.next++
	frees.hooks[id] = f
	return func() {
		frees.mu.Lock()
		delete(frees.hooks, id)
		frees.mu.Unlock()
	}
}

// AllocFile finds the memory Alloc returned that holds [addr, addr+n), and
// returns the memfd it is mapped from, with the mapping's address and
// length. It is for providers whose device runs in another process and can
// map the same memory; the descriptor stays Alloc's (valid until Free).
func AllocFile(addr uintptr, n uint64) (fd int, base uintptr, size int, ok bool) {
	allocs.mu.Lock()
	defer allocs.mu.Unlock()
	a := findAlloc(addr, n)
	if a == nil {
		return -1, 0, 0, false
	}
	return a.fd, a.base, cap(a.b), true
}

// holdAlloc finds the Alloc mapping containing [addr, addr+n) and counts a
// registration in it; it returns nil for memory from elsewhere.
func holdAlloc(addr uintptr, n uint64) *allocation {
	allocs.mu.Lock()
	defer allocs.mu.Unlock()
	a := findAlloc(addr, n)
	if a != nil {
		a.regs++
	}
	return a
}

// findAlloc finds the Alloc mapping containing [addr, addr+n). Caller holds
// allocs.mu.
func findAlloc(addr uintptr, n uint64) *allocation {
	i, found := slices.BinarySearchFunc(allocs.list, addr, byBase)
	if !found {
		i--
	}
	if i < 0 {
		return nil
	}
	a := allocs.list[i]
	// Up to the mapping's end: the bytes past len in its last page can be
	// registered too (b[:cap(b)]), and then must keep Free from unmapping.
	if addr < a.base || uint64(addr-a.base)+n > uint64(cap(a.b)) {
		return nil
	}
	return a
}

func (a *allocation) release() {
	allocs.mu.Lock()
	a.regs--
	allocs.mu.Unlock()
}
