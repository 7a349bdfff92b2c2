//go:build linux

package mlx4

import (
	"sync"
	"sync/atomic"
)

// qpTable finds the QP a CQE names, by number, for CQ polling. Every
// completion of a CQ shared by many QPs looks one up, so a lookup takes no
// lock: two atomic loads in a table of pages of qpPageSize entries, indexed
// by QP number (the kernel gives out QP numbers from a bounded range,
// mostly in order, so the live ones sit in a few pages). Writers, creating
// and destroying QPs, serialize on mu.
type qpTable struct {
	mu    sync.Mutex
	pages atomic.Pointer[[]atomic.Pointer[qpPage]] // by QP number >> qpPageShift
}

const (
	qpPageShift = 10
	qpPageSize  = 1 << qpPageShift
)

type qpPage struct {
	n   int // guarded by the table's mu: QPs in the page
	qps [qpPageSize]atomic.Pointer[QP]
}

// find returns the QP numbered qpn, or nil.
func (t *qpTable) find(qpn uint32) *QP {
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

// store puts qp in the table under its number.
func (t *qpTable) store(qp *QP) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := int(qp.qpn >> qpPageShift)
	ps := t.pages.Load()
	if ps == nil || i >= len(*ps) {
		// A longer index, published whole: a reader sees the old one or
		// the new one.
		n := 0
		if ps != nil {
			n = len(*ps)
		}
		grown := make([]atomic.Pointer[qpPage], max(i+1, 2*n))
		for j := range n {
			grown[j].Store((*ps)[j].Load())
		}
		t.pages.Store(&grown)
		ps = &grown
	}
	p := (*ps)[i].Load()
	if p == nil {
		p = new(qpPage)
		(*ps)[i].Store(p)
	}
	if p.qps[qp.qpn&(qpPageSize-1)].Swap(qp) == nil {
		p.n++
	}
}

// forget takes QP qpn out of the table, and its page once empty.
func (t *qpTable) forget(qpn uint32) {
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
