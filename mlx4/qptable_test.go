package mlx4

import (
	"sync"
	"testing"
)

// TestQPTable checks the lock-free QP table CQ polling uses: lookups of
// numbers in use, free and beyond every page, pages dropped when they
// empty, and lookups that run while QPs come and go (for the race
// detector).
func TestQPTable(t *testing.T) {
	var tb qpTable
	if tb.find(0x48) != nil {
		t.Fatal("find in an empty table")
	}
	var qps []*QP
	for _, n := range []uint32{0x48, 0x49, 0x3ff, 0x400, 0x5000, 0xfffff, 0xffffff} {
		qp := &QP{qpn: n}
		qps = append(qps, qp)
		tb.store(qp)
	}
	for _, qp := range qps {
		if tb.find(qp.qpn) != qp {
			t.Fatalf("find(%#x) misses", qp.qpn)
		}
	}
	for _, n := range []uint32{0, 0x4a, 0x401, 0x1000000, ^uint32(0)} {
		if qp := tb.find(n); qp != nil {
			t.Fatalf("find(%#x) = QP %#x", n, qp.qpn)
		}
	}
	for _, qp := range qps {
		tb.forget(qp.qpn)
		tb.forget(qp.qpn) // twice: no effect
		if tb.find(qp.qpn) != nil {
			t.Fatalf("QP %#x found after forget", qp.qpn)
		}
	}
	for i := range *tb.pages.Load() {
		if (*tb.pages.Load())[i].Load() != nil {
			t.Fatalf("page %d kept after its QPs went", i)
		}
	}

	// Readers while a writer stores and forgets.
	stable := &QP{qpn: 0x100}
	tb.store(stable)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if tb.find(stable.qpn) != stable {
					t.Error("stable QP not found")
					return
				}
				tb.find(0x2000)
			}
		}()
	}
	for i := range 2000 {
		qp := &QP{qpn: uint32(0x1000 + i%4096)}
		tb.store(qp)
		tb.forget(qp.qpn)
	}
	close(stop)
	wg.Wait()
}

// TestQPSRQTable checks that a context finds the SRQ of a QP on one by the
// QP's number while the QP lives, and not after: a QP that later gets the
// number, with a receive queue of its own, must not have its receive
// completions taken from the old QP's SRQ.
func TestQPSRQTable(t *testing.T) {
	var c Context
	srq := &SRQ{}
	onSRQ, own := &QP{qpn: 0x48, srq: srq}, &QP{qpn: 0x48}
	if err := c.storeQP(onSRQ); err != nil {
		t.Fatal(err)
	}
	if got := c.qpSRQs.find(0x48); got != srq {
		t.Fatalf("SRQ of QP 0x48: %p, want %p", got, srq)
	}
	c.forgetQP(onSRQ)
	if got := c.qpSRQs.find(0x48); got != nil {
		t.Fatalf("SRQ of destroyed QP 0x48 still found")
	}
	if err := c.storeQP(own); err != nil {
		t.Fatal(err)
	}
	if c.qpSRQs.find(0x48) != nil || c.findQP(0x48) != own {
		t.Fatal("the number's new QP, with its own receive queue, is taken for the old one")
	}
}
