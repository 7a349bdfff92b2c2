//go:build linux

package mlx4

import (
	"cmp"
	"slices"
	"sync"
	"unsafe"

	"github.com/xrcrun/xrc/internal/unix"
)

// queueMem hands out the memory of queues (work and completion queue
// buffers, doorbell pages) in whole pages, carved from chunks it takes
// from the Kernel, so that thousands of queues share a few allocations.
//
// Every AllocQueue is a mapping of this process and, with a software HCA
// in another process, a memfd passed to the device and a mapping of the
// device's too: taken one per queue, 10,000 QPs cost 10,000 of each, and
// a device serving a few such clients ran out of mappings
// (vm.max_map_count) long before its max_qp. rdma-core's providers take
// queue buffers from the process's heap in the same spirit.
//
// With a device that takes them (packed, Packer), a buffer of at most
// maxSmall bytes comes from a page shared with buffers of its size, a
// power of two from minSmall: the 4-slot send queue of a QP takes 256
// bytes, not a page of its own.
//
// A buffer is zeroed when it is handed out. queueMem owns its chunks and
// small pages; a buffer is the caller's from alloc until free, and the
// device's to reach for as long as the caller keeps a queue on it.
type queueMem struct {
	k      Kernel
	packed bool // set before the first alloc
	mu     sync.Mutex
	chunks []*qchunk // guarded by mu; sorted by address
	// Pages cut into small buffers, by address, and of each size class
	// those with a buffer free; guarded by mu.
	small   map[uintptr]*smallPage
	partial [smallClasses][]*smallPage
}

// smallPage is a page of a chunk cut into buffers of one size.
type smallPage struct {
	b     []byte   // the page
	class int      // the buffers are minSmall<<class bytes
	used  []uint64 // a bit per buffer
	n     int      // buffers in use
}

// qchunk is one allocation of the Kernel that buffers are carved from.
type qchunk struct {
	b    []byte
	used [chunkPages / 64]uint64 // a bit per page
	runs [chunkPages]uint8       // the pages of the buffer that starts at a page, or 0
	n    int                     // pages in use
}

const (
	chunkPages = 256 // pages in a chunk: 1 MiB with 4 KiB pages
	// maxPooledPages is the largest buffer taken from a chunk; a larger
	// one is an allocation of its own.
	maxPooledPages = 16
	// Small buffers (packed): from minSmall (a cache line, the alignment
	// the device asks for) to maxSmall bytes, in smallClasses sizes.
	minSmall     = 64
	maxSmall     = 2048
	smallClasses = 6
)

// alloc returns a zeroed buffer of n bytes: page-aligned and of whole
// pages, or, packed, a small one (n <= maxSmall) aligned to its capacity, a
// power of two from minSmall.
func (m *queueMem) alloc(n int) ([]byte, error) {
	ps := unix.PageSize
	pages := (n + ps - 1) / ps
	if n <= 0 || pages > maxPooledPages {
		b, err := m.k.AllocQueue(pages * ps)
		if err != nil {
			return nil, err
		}
		return b[: n : pages*ps], nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.packed && n <= maxSmall && 2*maxSmall <= ps {
		return m.allocSmall(n)
	}
	return m.allocPages(n, pages)
}

// allocPages returns a buffer of n bytes on pages whole pages of a chunk.
// Caller holds m.mu.
func (m *queueMem) allocPages(n, pages int) ([]byte, error) {
	ps := unix.PageSize
	for _, c := range m.chunks {
		if c.n+pages > chunkPages {
			continue
		}
		if p, ok := c.take(pages); ok {
			off := p * ps
			return c.b[off : off+n : off+pages*ps], nil
		}
	}
	b, err := m.k.AllocQueue(chunkPages * ps)
	if err != nil {
		return nil, err
	}
	c := &qchunk{b: b[:cap(b)]}
	i, _ := m.find(addrOf(c.b))
	m.chunks = slices.Insert(m.chunks, i, c)
	p, _ := c.take(pages)
	return c.b[p*ps : p*ps+n : (p+pages)*ps], nil
}

// free gives back a buffer from alloc. It clears the buffer's pages, so
// that they come out of alloc zeroed again. A chunk none of whose pages
// are in use goes back to the Kernel if another one is empty too: one
// stays, so that a queue created and destroyed again and again while the
// other chunks are full does not take and give back a chunk every time.
func (m *queueMem) free(b []byte) error {
	ps := unix.PageSize
	m.mu.Lock()
	defer m.mu.Unlock()
	if cap(b) < ps { // only a small buffer is less than a page
		p := m.small[addrOf(b)&^uintptr(ps-1)]
		if p == nil {
			return unix.Errorf(unix.EINVAL, "free of queue memory that is not a buffer in use (%d bytes at %#x)", cap(b), addrOf(b))
		}
		return m.freeSmall(p, b)
	}
	return m.freePages(b)
}

// freePages gives back a buffer of whole pages. Caller holds m.mu.
func (m *queueMem) freePages(b []byte) error {
	ps := unix.PageSize
	i, c := m.chunkOf(addrOf(b))
	if c == nil {
		return m.k.FreeQueue(b)
	}
	off := int(addrOf(b) - addrOf(c.b))
	p, pages := off/ps, cap(b)/ps
	if off%ps != 0 || int(c.runs[p]) != pages || cap(b)%ps != 0 {
		return unix.Errorf(unix.EINVAL, "free of queue memory that is not a buffer in use (%d bytes at page %d of a chunk)", cap(b), p)
	}
	clear(b[:cap(b)])
	c.mark(p, pages, false)
	c.runs[p] = 0
	c.n -= pages
	if c.n == 0 && slices.ContainsFunc(m.chunks, func(o *qchunk) bool { return o != c && o.n == 0 }) {
		m.chunks = slices.Delete(m.chunks, i, i+1)
		return m.k.FreeQueue(c.b)
	}
	return nil
}

// allocSmall returns a buffer of n bytes (at most maxSmall) from a page of
// buffers of its size. Caller holds m.mu.
func (m *queueMem) allocSmall(n int) ([]byte, error) {
	class := 0
	for minSmall<<class < n {
		class++
	}
	size := minSmall << class
	if len(m.partial[class]) == 0 {
		pb, err := m.allocPages(unix.PageSize, 1)
		if err != nil {
			return nil, err
		}
		p := &smallPage{b: pb, class: class, used: make([]uint64, (unix.PageSize/size+63)/64)}
		if m.small == nil {
			m.small = make(map[uintptr]*smallPage)
		}
		m.small[addrOf(pb)] = p
		m.partial[class] = append(m.partial[class], p)
	}
	ps := m.partial[class]
	p := ps[len(ps)-1]
	for i := range unix.PageSize / size {
		if p.used[i/64]&(1<<(i%64)) != 0 {
			continue
		}
		p.used[i/64] |= 1 << (i % 64)
		if p.n++; p.n == unix.PageSize/size {
			m.partial[class] = ps[:len(ps)-1]
		}
		return p.b[i*size : i*size+n : (i+1)*size], nil
	}
	panic("mlx4: a small page in the partial list has no buffer free")
}

// freeSmall gives back b, a buffer of page p. It clears the buffer; a page
// none of whose buffers is in use goes back to its chunk. Caller holds
// m.mu.
func (m *queueMem) freeSmall(p *smallPage, b []byte) error {
	size := minSmall << p.class
	off := int(addrOf(b) - addrOf(p.b))
	i := off / size
	if off%size != 0 || cap(b) != size || p.used[i/64]&(1<<(i%64)) == 0 {
		return unix.Errorf(unix.EINVAL, "free of queue memory that is not a buffer in use (%d bytes at %d of a page of %d-byte buffers)", cap(b), off, size)
	}
	clear(b[:cap(b)])
	p.used[i/64] &^= 1 << (i % 64)
	if p.n--; p.n == unix.PageSize/size-1 {
		m.partial[p.class] = append(m.partial[p.class], p)
	}
	if p.n > 0 {
		return nil
	}
	m.partial[p.class] = slices.DeleteFunc(m.partial[p.class], func(o *smallPage) bool { return o == p })
	delete(m.small, addrOf(p.b))
	return m.freePages(p.b)
}

// close gives back the chunks no buffer is in use in. Those that still
// hold buffers stay mapped: a queue the caller did not destroy may still
// be reached.
func (m *queueMem) close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var err error
	m.chunks = slices.DeleteFunc(m.chunks, func(c *qchunk) bool {
		if c.n != 0 {
			return false
		}
		if e := m.k.FreeQueue(c.b); err == nil {
			err = e
		}
		return true
	})
	return err
}

// find returns where a chunk at addr is or would be in m.chunks.
func (m *queueMem) find(addr uintptr) (int, bool) {
	return slices.BinarySearchFunc(m.chunks, addr, func(c *qchunk, a uintptr) int { return cmp.Compare(addrOf(c.b), a) })
}

// chunkOf returns the chunk that holds addr, or nil.
func (m *queueMem) chunkOf(addr uintptr) (int, *qchunk) {
	i, found := m.find(addr)
	if !found {
		i--
	}
	if i >= 0 {
		c := m.chunks[i]
		if addr-addrOf(c.b) < uintptr(len(c.b)) {
			return i, c
		}
	}
	return -1, nil
}

// take marks the first run of pages free pages in use and returns its
// first page.
func (c *qchunk) take(pages int) (int, bool) {
	run := 0
	for p := range chunkPages {
		if c.used[p/64]&(1<<(p%64)) != 0 {
			run = 0
			continue
		}
		if run++; run == pages {
			first := p - pages + 1
			c.mark(first, pages, true)
			c.runs[first] = uint8(pages)
			c.n += pages
			return first, true
		}
	}
	return 0, false
}

func (c *qchunk) mark(first, pages int, used bool) {
	for p := first; p < first+pages; p++ {
		if used {
			c.used[p/64] |= 1 << (p % 64)
		} else {
			c.used[p/64] &^= 1 << (p % 64)
		}
	}
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
