//go:build linux

package softhca

import (
	"testing"
	"time"

	"github.com/xrcrun/xrc/internal/qpstate"
	"github.com/xrcrun/xrc/softhca/roce"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// TestTooManyReads: a READ that comes while every responder resource
// (max_dest_rd_atomic, 4 here) holds a READ whose responses have not all
// been sent once is one more than the requester may have outstanding: it
// is NAKed Invalid Request (the IBTA's "too many RDMA READ or ATOMIC
// requests"), after the responses of the READs before it, and the QP
// fails. Before, the oldest READ's responses stopped where they were and
// the new READ was answered.
func TestTooManyReads(t *testing.T) {
	r := newRigWith(t, verbstest.Options{MTU: verbs.MTU256})
	q := r.d.qps.get(r.qp.Num())
	next := r.heldReads()
	r.inject(func(p *roce.Packet) {
		p.Opcode, p.PSN, p.VA, p.RKey, p.DMALen = roce.ReadRequest, next, r.mr.Addr(), r.mr.RKey(), 256
	})
	r.lockedWhen(t, "the fifth READ taken", func() bool { return q.state == qpstate.Err || q.resp.epsn != next })
	r.letReadsGo()
	r.d.mu.Unlock()
	var got []*roce.Packet
	waitFor(t, "an answer to the fifth READ", func() bool {
		got = append(got, r.sink.drain()...)
		return len(got) > 0 && got[len(got)-1].PSN == next
	})
	time.Sleep(10 * time.Millisecond)
	got = append(got, r.sink.drain()...)
	for i, p := range got[:len(got)-1] {
		if p.Opcode.Op() == roce.Acknowledge || p.PSN != readPSN+uint32(i) {
			t.Fatalf("packet %d: %v PSN %#x, want the READ response PSN %#x", i, p.Opcode, p.PSN, readPSN+i)
		}
	}
	last := got[len(got)-1]
	if len(got) != 4*64+1 || last.Opcode.Op() != roce.Acknowledge || last.Syndrome != roce.AETHNak|roce.NakInvalidRequest {
		t.Fatalf("%d packets, the last %v PSN %#x syndrome %#x; want the %d READ responses, then an Invalid Request NAK",
			len(got), last.Opcode, last.PSN, last.Syndrome, 4*64)
	}
	r.d.mu.Lock()
	st := q.state
	r.d.mu.Unlock()
	if st != qpstate.Err {
		t.Errorf("QP in state %v after too many READs, want the error state", st)
	}
}
