package softhca

import (
	"slices"
	"testing"
)

// TestResponderResources checks the responder's ring of READ and atomic
// resources: made on first use with max_dest_rd_atomic entries, reused
// oldest first once answered (a READ answered again stops), never before,
// and grown, with the READs queued following their entries, when
// max_dest_rd_atomic is raised.
func TestResponderResources(t *testing.T) {
	d := &Device{}
	q := &qp{maxDestRdAtomic: 2}
	s := &q.resp
	if s.res != nil {
		t.Fatal("resources made before any READ")
	}
	rem := func(psn uint32, queue bool) *resource {
		r := d.remember(q)
		*r = resource{valid: true, psn: psn, npkts: 1, answered: true}
		if queue { // answered, and asked for again
			r.queued = true
			s.reads = append(s.reads, r)
		}
		return r
	}
	a := rem(1, false)
	b := rem(2, true)
	if len(s.res) != 2 {
		t.Fatalf("%d resources for max_dest_rd_atomic 2", len(s.res))
	}
	if c := rem(3, false); c != a {
		t.Fatal("the third request did not reuse the oldest entry")
	}
	// The ring now holds, oldest first: 2 (queued), 3.
	q.maxDestRdAtomic = 4
	rem(4, false)
	if len(s.res) != 4 {
		t.Fatalf("%d resources after raising max_dest_rd_atomic to 4", len(s.res))
	}
	var psns []uint32
	for i := range s.res {
		psns = append(psns, s.res[i].psn)
	}
	if want := []uint32{2, 3, 4, 0}; !slices.Equal(psns, want) {
		t.Fatalf("resources %v after growing, want %v", psns, want)
	}
	if len(s.reads) != 1 || s.reads[0] != &s.res[0] || s.reads[0].psn != 2 || b == s.reads[0] {
		t.Fatalf("the queued READ does not follow its entry: %+v", s.reads)
	}
	rem(5, false)
	if r := rem(6, false); r != &s.res[0] || len(s.reads) != 0 {
		t.Fatalf("reusing the entry of a queued READ: reads %d", len(s.reads))
	}
	s.res[s.resNext].answered = false // its responses still to be sent
	if next := s.resNext; d.remember(q) != nil || s.resNext != next {
		t.Fatal("reused the entry of a READ not answered yet")
	}
	s.reset()
	if len(s.res) != 4 || s.res[1].valid || s.resNext != 0 {
		t.Fatal("reset kept resources valid")
	}
}
