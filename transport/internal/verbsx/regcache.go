package verbsx

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/verbs"
)

// RegCache keeps memory regions of the buffers given to Expose and Read,
// so that a buffer used again (a program's send and receive buffers
// usually are) is not registered again. An entry is found by the pages it
// covers and matches any range inside the bytes it registered (the exact
// slice: Go memory around it may belong to other objects, which must not
// be pinned). Entries in use are counted; unused ones stay registered —
// which pins their memory, keeping its addresses valid — up to MaxIdle
// entries and MaxIdleBytes, the least recently used going first, or until
// verbs.Free unmaps their memory (the cache hooks it: verbs.OnFree). Used
// by the goroutine calling the transport, and by verbs.Free's hook on any
// goroutine: mu guards the rest.
type RegCache struct {
	pd      *verbs.PD
	unhook  func() // removes the hook of verbs.Free
	mu      sync.Mutex
	byPage  map[uintptr][]*RegEntry // by every page an entry covers
	entries int
	idle    []*RegEntry // unused, least recently used first
	idleLen int
	bytes   int64 // registered by the cache
	// Errors of closing regions for verbs.Free, which Close returns (the
	// regions stay registered, and Free fails with EBUSY).
	dropErrs []error
	closed   bool
}

// RegEntry is one registration of the cache; MR is its memory region.
type RegEntry struct {
	addr  uintptr
	n     int
	MR    *verbs.MR
	users int
}

// Bounds of the unused entries the cache keeps. An idle entry keeps its
// memory registered (pinned) and, for Go memory, reachable: the bounds
// keep a program that sends from fresh buffers from holding them all.
const (
	MaxIdle      = 16
	MaxIdleBytes = 32 << 20
	// Entries are indexed by page for the lookup; a huge buffer is
	// indexed by its first page only, and found only from there.
	maxIndexedPages = 1024
)

var pageSize = uintptr(os.Getpagesize())

// NewRegCache makes an empty cache registering regions of pd. Close
// releases it.
func NewRegCache(pd *verbs.PD) *RegCache {
	c := &RegCache{pd: pd, byPage: map[uintptr][]*RegEntry{}}
	c.unhook = verbs.OnFree(c.freeing)
	return c
}

// freeing closes the unused entries in b, memory verbs.Free is about to
// unmap. Entries in use stay, and Free fails: the memory is still the
// device's.
func (c *RegCache) freeing(b []byte) {
	lo := unix.AddrOf(b)
	hi := lo + uintptr(len(b))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return // a Free under way when Close unhooked it
	}
	for _, e := range slices.Clone(c.idle) {
		if e.addr < hi && lo < e.addr+uintptr(e.n) {
			if err := c.drop(e); err != nil {
				// Free then fails with EBUSY; Close returns this.
				c.dropErrs = append(c.dropErrs, err)
			}
		}
	}
}

func (c *RegCache) pages(addr uintptr, n int) (first, last uintptr) {
	first = addr &^ (pageSize - 1)
	last = (addr + uintptr(n) - 1) &^ (pageSize - 1)
	if (last-first)/pageSize >= maxIndexedPages {
		last = first
	}
	return first, last
}

// Get returns a registration covering buf (not empty), counting a user.
func (c *RegCache) Get(buf []byte) (*RegEntry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	addr := unix.AddrOf(buf)
	first, _ := c.pages(addr, len(buf))
	for _, e := range c.byPage[first] {
		if e.addr <= addr && addr+uintptr(len(buf)) <= e.addr+uintptr(e.n) {
			if e.users == 0 {
				c.unidle(e)
			}
			e.users++
			return e, nil
		}
	}
	mr, err := c.pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		return nil, fmt.Errorf("register %d bytes: %w", len(buf), err)
	}
	e := &RegEntry{addr: addr, n: len(buf), MR: mr, users: 1}
	f, l := c.pages(addr, len(buf))
	for pg := f; pg <= l; pg += pageSize {
		c.byPage[pg] = append(c.byPage[pg], e)
	}
	c.entries++
	c.bytes += int64(len(buf))
	return e, nil
}

// Find returns the entry whose region is rkey and covers [addr, addr+n).
func (c *RegCache) Find(addr uintptr, n int, rkey uint32) *RegEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	first, _ := c.pages(addr, max(n, 1))
	for _, e := range c.byPage[first] {
		if e.MR.RKey() == rkey && e.addr <= addr && addr+uintptr(n) <= e.addr+uintptr(e.n) && e.users > 0 {
			return e
		}
	}
	return nil
}

// Put drops a user of e; an unused entry is kept while the cache has room.
func (c *RegCache) Put(e *RegEntry) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.users--
	if e.users > 0 {
		return nil
	}
	c.idle = append(c.idle, e)
	c.idleLen += e.n
	var errs []error
	for len(c.idle) > MaxIdle || c.idleLen > MaxIdleBytes {
		errs = append(errs, c.drop(c.idle[0]))
	}
	return errors.Join(errs...)
}

func (c *RegCache) unidle(e *RegEntry) {
	for i, x := range c.idle {
		if x == e {
			c.idle = append(c.idle[:i], c.idle[i+1:]...)
			c.idleLen -= e.n
			return
		}
	}
}

// drop deregisters an unused entry.
func (c *RegCache) drop(e *RegEntry) error {
	c.unidle(e)
	f, l := c.pages(e.addr, e.n)
	for pg := f; pg <= l; pg += pageSize {
		list := c.byPage[pg]
		for i, x := range list {
			if x == e {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(c.byPage, pg)
		} else {
			c.byPage[pg] = list
		}
	}
	c.entries--
	c.bytes -= int64(e.n)
	return e.MR.Close()
}

// Close deregisters every entry, in use or not, and unhooks verbs.Free.
func (c *RegCache) Close() error {
	c.unhook()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	seen := map[*RegEntry]bool{}
	var errs []error
	for _, list := range c.byPage {
		for _, e := range list {
			if !seen[e] {
				seen[e] = true
				errs = append(errs, e.MR.Close())
			}
		}
	}
	errs = append(errs, c.dropErrs...)
	c.byPage, c.idle, c.idleLen, c.entries, c.bytes, c.dropErrs = map[uintptr][]*RegEntry{}, nil, 0, 0, 0, nil
	return errors.Join(errs...)
}

// Entries is the number of regions the cache holds, in use or not.
func (c *RegCache) Entries() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries
}

// Bytes is the memory the cache's regions cover.
func (c *RegCache) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}
