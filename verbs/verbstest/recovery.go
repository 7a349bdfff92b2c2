package verbstest

import (
	"bytes"
	"testing"
	"time"

	"github.com/xrcrun/xrc/verbs"
)

// The tests in this file cover the corners where a device must keep its
// books straight: retries of one-packet messages, completion order around
// an error, a QP reused after RESET, PSNs that wrap, and receives posted to
// a QP already in error.

// testWriteImmRNR: an RDMA WRITE with immediate consumes a receive; without
// one the responder answers RNR NAK, and once a receive is posted the retry
// succeeds.
func testWriteImmRNR(t *testing.T, env Env) {
	o := defaultOpts()
	o.rnrRetry = 7 // for ever
	o.minRNR = 1
	p := newPair(t, env, o)
	fill(p.a.buf[:100], 9)
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 6, Opcode: verbs.WRRDMAWriteWithImm, Flags: verbs.SendSignaled,
		Imm: 1, SG: []verbs.SGE{p.a.mr.SGE(0, 100)}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}))
	noCompletion(t, p.a.cq, 2*time.Millisecond)
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 5}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 6)
	wc := pollOne(t, p.b.cq, verbs.WCSuccess, 5)
	if wc.Opcode != verbs.WCRecvRDMAWithImm || !bytes.Equal(p.a.buf[:100], p.b.buf[:100]) {
		t.Fatalf("after RNR: %+v", wc)
	}
}

// testCompletionOrderOnError: a good send and then a bad one in one post
// complete in order, and work posted to the QP in error is flushed.
func testCompletionOrderOnError(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	bad := p.a.mr.SGE(0, 16)
	bad.LKey ^= 0x5500
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{p.b.mr.SGE(0, 64)}}))
	second := &verbs.SendWR{WRID: 7, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{bad}}
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 6, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(0, 16)}, Next: second}))
	wcs := poll(t, p.a.cq, 2)
	if wcs[0].WRID != 6 || wcs[1].WRID != 7 || wcs[1].Status != verbs.WCLocProtErr {
		t.Fatalf("completions %+v, %+v: want wr 6 then wr 7 with a protection error", wcs[0], wcs[1])
	}
	waitState(t, p.a.qp, verbs.QPSErr)
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 8, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{p.a.mr.SGE(0, 8)}}))
	pollOne(t, p.a.cq, verbs.WCWRFlushErr, 8)
}

// testResetAndReconnect: a QP reset with a send outstanding toward nobody,
// then connected to its real peer, sends only the new work.
func testResetAndReconnect(t *testing.T, env Env) {
	o := defaultOpts()
	o.noConnect = true
	o.timeout = 0 // wait for ever: only the reset ends the lost send
	p := newPair(t, env, o)
	connect(t, p.b, p.a, o)
	connectTo(t, p.a, p.b.port.GID, 0xfffff0, o) // nobody answers
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{p.a.mr.SGE(0, 8)}}))
	noCompletion(t, p.a.cq, 5*time.Millisecond)
	check(t, p.a.qp.Modify(&verbs.QPAttr{State: verbs.QPSReset}, verbs.QPAttrState))
	connect(t, p.a, p.b, o)
	fill(p.a.buf[:8], 3)
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 2, SG: []verbs.SGE{p.b.mr.SGE(0, 64)}}))
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 3, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{p.a.mr.SGE(0, 8)}}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 3) // not wr 1: RESET discarded it
	wc := pollOne(t, p.b.cq, verbs.WCSuccess, 2)
	if wc.ByteLen != 8 || !bytes.Equal(p.a.buf[:8], p.b.buf[:8]) {
		t.Fatalf("after reconnect: %+v", wc)
	}
}

// testPSNWrap: multi-packet SENDs and READs whose PSNs cross 2^24.
func testPSNWrap(t *testing.T, env Env) {
	o := defaultOpts()
	o.psn = 0xfffff0
	p := newPair(t, env, o)
	for i := range 3 {
		sendRecv(t, p, 40000, byte(i))
		const n = 50000
		fill(p.b.buf[:n], byte(i+3))
		check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 9, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{p.a.mr.SGE(0, n)}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}))
		pollOne(t, p.a.cq, verbs.WCSuccess, 9)
		if !bytes.Equal(p.a.buf[:n], p.b.buf[:n]) {
			t.Fatalf("read %d across the PSN wrap differs", i)
		}
	}
}

// testRecvPostedInError: a receive posted to a QP in the error state is
// flushed.
func testRecvPostedInError(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	check(t, p.b.qp.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState))
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 77, SG: []verbs.SGE{p.b.mr.SGE(0, 64)}}))
	pollOne(t, p.b.cq, verbs.WCWRFlushErr, 77)
}
