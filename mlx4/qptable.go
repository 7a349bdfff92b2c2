//go:build linux

package mlx4

import (
	"sync"
	"sync/atomic"

	"github.com/xrcrun/xrc/internal/unix"
)

// numTable finds the QP (or the XRC SRQ) a CQE names, by number, for CQ
// polling. Every completion of a CQ shared by many QPs looks one up, so a
// lookup takes no lock: two atomic loads in a table of pages of qpPageSize
// entries, indexed by number (the kernel gives out QP and SRQ numbers from a
// bounded range, mostly in order, so the live ones sit in a few pages).
// Writers, creating and destroying objects, serialize on mu.
type numTable[T any] struct {
	mu    sync.Mutex
	pages atomic.Pointer[[]atomic.Pointer[qpPage[T]]] // by number >> qpPageShift
}

// qpTable holds a context's QPs by QP number.
type qpTable struct{ numTable[QP] }

func (t *qpTable) store(qp *QP) error { return t.add(qp.qpn, qp) }

const (
	qpPageShift = 10
	qpPageSize  = 1 << qpPageShift
)

type qpPage[T any] struct {
	n   int // guarded by the table's mu: entries in the page
	qps [qpPageSize]atomic.Pointer[T]
}

// find returns the entry numbered qpn, or nil.
func (t *numTable[T]) find(qpn uint32) *T {
	ps := t.pages.Load()
	if ps == nil {
		return nil
	}
	i := qpn >> qpPageShift
	if i >= uint32(len(*ps)) {
		return nil
	}
	p := (*ps)[i].Load()
	if p == nil {
		return nil
	}
	return p.qps[qpn&(qpPageSize-1)].Load()
}

// maxNum is the largest QP or SRQ number: they are 24 bits.
const maxNum = 1<<24 - 1

// add puts v, a new object, in the table under the number the device gave
// it, which must be in range and not a live object's. A trusted device
// gives such numbers; the check keeps a faulty one from growing the table
// without bound or taking another object's entry.
func (t *numTable[T]) add(n uint32, v *T) error {
	if n > maxNum {
		return unix.Errorf(unix.EPROTO, "the device gave number %#x, beyond 24 bits", n)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.find(n) != nil {
		return unix.Errorf(unix.EPROTO, "the device gave number %#x, which a live object has", n)
	}
	t.putLocked(n, v)
	return nil
}

// put puts v in the table under number qpn.
func (t *numTable[T]) put(qpn uint32, v *T) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.putLocked(qpn, v)
}

func (t *numTable[T]) putLocked(qpn uint32, v *T) {
	i := int(qpn >> qpPageShift)
	ps := t.pages.Load()
	if ps == nil || i >= len(*ps) {
		// A longer index, published whole: a reader sees the old one or
		// the new one.
		n := 0
		if ps != nil {
			n = len(*ps)
		}
		grown := make([]atomic.Pointer[qpPage[T]], max(i+1, 2*n))
		for j := range n {
			grown[j].Store((*ps)[j].Load())
		}
		t.pages.Store(&grown)
		ps = &grown
	}
	p := (*ps)[i].Load()
	if p == nil {
		p = new(qpPage[T])
		(*ps)[i].Store(p)
	}
	if p.qps[qpn&(qpPageSize-1)].Swap(v) == nil {
		p.n++
	}
}

// forget takes entry qpn out of the table, and its page once empty.
func (t *numTable[T]) forget(qpn uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ps := t.pages.Load()
	i := qpn >> qpPageShift
	if ps == nil || i >= uint32(len(*ps)) {
		return
	}
	p := (*ps)[i].Load()
	if p == nil || p.qps[qpn&(qpPageSize-1)].Swap(nil) == nil {
		return
	}
	if p.n--; p.n == 0 {
		(*ps)[i].Store(nil)
	}
}
