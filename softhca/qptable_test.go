package softhca

import "testing"

// TestQPTable checks the QP table: lookups of numbers in use, free, and
// beyond every page; pages made and dropped as QPs come and go; and the
// numbers allocQPN gives out around the end of the number space.
func TestQPTable(t *testing.T) {
	d := &Device{nextQPN: firstQPN}
	create := func() *qp {
		q := &qp{num: d.allocQPN()}
		d.qps.add(q)
		return q
	}
	destroy := func(q *qp) { d.qps.remove(q.num, d.nextQPN) }

	qs := make([]*qp, 3*qpPageSize)
	for i := range qs {
		qs[i] = create()
		if want := uint32(firstQPN + i); qs[i].num != want {
			t.Fatalf("QP %d numbered %#x, want %#x", i, qs[i].num, want)
		}
	}
	for _, q := range qs {
		if got := d.qps.get(q.num); got != q {
			t.Fatalf("get(%#x) = %p, want %p", q.num, got, q)
		}
	}
	for _, n := range []uint32{0, firstQPN - 1, firstQPN + 3*qpPageSize, 1<<24 - 1, 1 << 31, ^uint32(0)} {
		if q := d.qps.get(n); q != nil {
			t.Fatalf("get(%#x) = QP %#x, want none", n, q.num)
		}
	}
	if d.qps.len() != len(qs) {
		t.Fatalf("len %d, want %d", d.qps.len(), len(qs))
	}

	// Emptying a page drops it; the page of the next number stays even
	// when empty.
	byPage := map[uint32][]*qp{}
	for _, q := range qs {
		byPage[q.num>>qpPageShift] = append(byPage[q.num>>qpPageShift], q)
	}
	nextPage := d.nextQPN >> qpPageShift
	if len(byPage[nextPage]) == 0 {
		t.Fatalf("test setup: no QP in the page of the next number %#x", d.nextQPN)
	}
	for _, q := range byPage[0] {
		destroy(q)
	}
	if d.qps.pages[0] != nil {
		t.Fatal("empty first page kept")
	}
	if d.qps.get(qs[0].num) != nil {
		t.Fatal("destroyed QP still found")
	}
	for _, q := range byPage[nextPage] {
		destroy(q)
	}
	if p := d.qps.pages[nextPage]; p == nil || p.n != 0 {
		t.Fatal("the page of the next QP number was dropped")
	}
	// Emptying every page leaves only that one.
	for i, qs := range byPage {
		if i != 0 && i != nextPage {
			for _, q := range qs {
				destroy(q)
			}
		}
	}
	kept := 0
	for _, p := range d.qps.pages {
		if p != nil {
			kept++
		}
	}
	if kept != 1 || d.qps.len() != 0 {
		t.Fatalf("%d pages and %d QPs left, want 1 and 0", kept, d.qps.len())
	}
	n := 0
	for range d.qps.all {
		n++
	}
	if n != 0 {
		t.Fatalf("all yields %d QPs of an empty table", n)
	}

	// Around the end of the number space: numbers wrap to firstQPN and
	// skip those in use.
	low := create() // not at firstQPN: numbers are not reused soon
	d.nextQPN = 1<<23 - 2
	a, b := create(), create()
	d.nextQPN = low.num
	c := create()
	if a.num != 1<<23-2 || b.num != 1<<23-1 || c.num != low.num+1 {
		t.Fatalf("numbers %#x %#x %#x around the wrap, want %#x %#x %#x", a.num, b.num, c.num, 1<<23-2, 1<<23-1, low.num+1)
	}
	d.nextQPN = 1<<23 - 1
	destroy(b)
	e := create()
	f := create()
	if e.num != 1<<23-1 || f.num != firstQPN {
		t.Fatalf("numbers %#x %#x at the wrap, want %#x %#x", e.num, f.num, 1<<23-1, firstQPN)
	}
	for _, q := range []*qp{low, a, c, e, f} {
		if d.qps.get(q.num) != q {
			t.Fatalf("QP %#x not found", q.num)
		}
	}
}
