//go:build linux

package softhca

import "unsafe"

// qpTable finds a QP by its number on the data path (every packet and
// every send doorbell names one) with two loads instead of a map lookup:
// QP numbers are given out in order (allocQPN), so the live ones sit
// together in a few pages of qpPageSize entries. A page is allocated when
// the first of its numbers is given out and dropped when its last QP goes
// away, unless it holds the next number to give out; the page index is at
// most 2^23 >> qpPageShift.
type qpTable struct {
	pages []*qpPage // by QP number >> qpPageShift; nil: no QP in that range
	n     int       // QPs in the table
}

const (
	qpPageShift = 10
	qpPageSize  = 1 << qpPageShift
)

type qpPage struct {
	n   int // QPs in the page
	qps [qpPageSize]*qp
}

// qpnIndex is the part of a QP number the table is indexed by: XRC
// receive QPs carry bit 23 in their numbers besides a number allocQPN gave
// out, as mlx4 numbers them.
const qpnIndex = 1<<23 - 1

// get returns the QP numbered qpn, or nil.
func (t *qpTable) get(qpn uint32) *qp {
	q := t.getIndex(qpn & qpnIndex)
	if q == nil || q.num != qpn {
		return nil
	}
	return q
}

// getIndex returns the QP whose number's index is i, or nil.
func (t *qpTable) getIndex(qpn uint32) *qp {
	i := qpn >> qpPageShift
	if i >= uint32(len(t.pages)) {
		return nil
	}
	p := t.pages[i]
	if p == nil {
		return nil
	}
	return p.qps[qpn&(qpPageSize-1)]
}

// add puts q in the table under q.num, which must be free.
func (t *qpTable) add(q *qp) {
	n := q.num & qpnIndex
	i := int(n >> qpPageShift)
	if i >= len(t.pages) {
		t.pages = append(t.pages, make([]*qpPage, i+1-len(t.pages))...)
	}
	p := t.pages[i]
	if p == nil {
		p = new(qpPage)
		t.pages[i] = p
	}
	p.qps[n&(qpPageSize-1)] = q
	p.n++
	t.n++
}

// remove takes QP qpn out of the table. The page of next (the number
// allocQPN gives out next) is kept even if it empties: it is about to be
// used again.
func (t *qpTable) remove(qpn, next uint32) {
	qpn &= qpnIndex
	i := qpn >> qpPageShift
	p := t.pages[i]
	p.qps[qpn&(qpPageSize-1)] = nil
	p.n--
	t.n--
	if p.n > 0 || i == next>>qpPageShift {
		return
	}
	t.pages[i] = nil
	k := len(t.pages)
	for k > 0 && t.pages[k-1] == nil {
		k--
	}
	clear(t.pages[k:])
	t.pages = t.pages[:k]
}

// len is the number of QPs in the table.
func (t *qpTable) len() int { return t.n }

// all yields every QP in the table, by number. The loop body must not add
// or remove QPs.
func (t *qpTable) all(yield func(*qp) bool) {
	for _, p := range t.pages {
		if p == nil {
			continue
		}
		for _, q := range p.qps {
			if q != nil && !yield(q) {
				return
			}
		}
	}
}

// bytes is the Go heap the table takes.
func (t *qpTable) bytes() int {
	n := cap(t.pages) * int(unsafe.Sizeof((*qpPage)(nil)))
	for _, p := range t.pages {
		if p != nil {
			n += int(unsafe.Sizeof(*p))
		}
	}
	return n
}
