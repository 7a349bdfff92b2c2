package verbstest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/verbs"
)

// The XRC part of the suite: an XRC send QP on the first context sends to
// an XRC receive QP on the second, whose domain holds the XRC SRQs the
// messages name.

// xrcPair is a connected XRC send QP (a.qp) and receive QP (tgt).
type xrcPair struct {
	a, b *side // b.cq is the CQ of the XRC SRQs
	xrcd *verbs.XRCD
	srq  *verbs.SRQ
	tgt  *verbs.QP
}

func testXRC(t *testing.T, env Env) {
	tests := []struct {
		name string
		fn   func(*testing.T, Env)
	}{
		{"SendRecv", testXRCSendRecv},
		{"SendWithImm", testXRCSendWithImm},
		{"RDMA", testXRCRDMA},
		{"Atomics", testXRCAtomics},
		{"PDOfNamedSRQ", testXRCPDOfNamedSRQ},
		{"WrongDomain", testXRCWrongDomain},
		{"NoReceiveQueue", testXRCNoReceiveQueue},
		{"SharedDomain", testXRCSharedDomain},
		{"OpenQP", testXRCOpenQP},
		{"RemovedDomainFile", testXRCRemovedDomainFile},
		// The message that overruns is lost with the receive QP: its
		// sender retries until it gives up.
		{"CQOverrunRetryExceeded", testXRCCQOverrun},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, env) })
	}
}

// skipWithoutXRC skips a test on a device without XRC.
func skipWithoutXRC(t testing.TB, c *verbs.Context) {
	t.Helper()
	if err := c.Supports(verbs.FeatureXRC); errors.Is(err, verbs.ErrNotSupported) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
}

// newXRCPair connects an XRC send QP on env's first context to a receive
// QP on its second, in a private domain with one XRC SRQ.
func newXRCPair(t testing.TB, env Env) *xrcPair { return newXRCPairWith(t, env, defaultOpts()) }

// newXRCPairWith is newXRCPair with the QPs' attributes of o.
func newXRCPairWith(t testing.TB, env Env, o pairOpts) *xrcPair {
	t.Helper()
	ca, cb := env.Open(t)
	skipWithoutXRC(t, ca)
	skipWithoutXRC(t, cb)
	p := &xrcPair{a: newSide(t, ca, o, nil), b: newSide(t, cb, o, nil)}
	var err error
	if p.xrcd, err = cb.OpenXRCD(nil, os.O_CREATE); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, p.xrcd.Close()) })
	p.srq = newXSRQ(t, p.b, p.xrcd)
	p.a.qp, err = p.a.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTXRCIni, SendCQ: p.a.cq,
		Cap: verbs.QPCap{MaxSendWR: 64, MaxSendSGE: 4, MaxInlineData: 64}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, p.a.qp.Close()) })
	if p.tgt, err = p.xrcd.CreateTgtQP(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, p.tgt.Close()) })
	connectXRC(t, p.a.qp, p.tgt, p.a.port.GID, p.b.port.GID, o)
	return p
}

// newXSRQ makes an XRC SRQ of s's PD in x, completing into s.cq.
func newXSRQ(t testing.TB, s *side, x *verbs.XRCD) *verbs.SRQ {
	t.Helper()
	srq, err := s.pd.CreateXRCSRQ(x, s.cq, verbs.SRQAttr{MaxWR: 64, MaxSGE: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, srq.Close()) })
	return srq
}

// connectXRC brings an XRC send QP to RTS and a receive QP to RTR toward
// each other, with exactly the attributes the kernel's state table asks of
// each type.
func connectXRC(t testing.TB, ini, tgt *verbs.QP, iniGID, tgtGID verbs.GID, o pairOpts) {
	t.Helper()
	av := func(gid verbs.GID) verbs.AHAttr {
		return verbs.AHAttr{IsGlobal: true, Port: 1, GRH: verbs.GlobalRoute{DGID: gid, HopLimit: 64}}
	}
	init := verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: o.qpAccess}
	initMask := verbs.QPAttrState | verbs.QPAttrPkeyIndex | verbs.QPAttrPort | verbs.QPAttrAccessFlags
	steps := []struct {
		qp   *verbs.QP
		attr verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{ini, init, initMask},
		{tgt, init, initMask},
		{tgt, verbs.QPAttr{State: verbs.QPSRTR, PathMTU: o.mtu, DestQPN: ini.Num(), RQPSN: o.psn,
			MaxDestRdAtomic: 4, MinRNRTimer: o.minRNR, AH: av(iniGID)},
			verbs.QPAttrState | verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN |
				verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer},
		{ini, verbs.QPAttr{State: verbs.QPSRTR, PathMTU: o.mtu, DestQPN: tgt.Num(), RQPSN: o.psn, AH: av(tgtGID)},
			verbs.QPAttrState | verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN},
		{ini, verbs.QPAttr{State: verbs.QPSRTS, Timeout: o.timeout, RetryCnt: o.retryCnt, RNRRetry: o.rnrRetry,
			SQPSN: o.psn, MaxRdAtomic: 4},
			verbs.QPAttrState | verbs.QPAttrTimeout | verbs.QPAttrRetryCnt | verbs.QPAttrRNRRetry |
				verbs.QPAttrSQPSN | verbs.QPAttrMaxQPRdAtomic},
	}
	for _, st := range steps {
		if err := st.qp.Modify(&st.attr, st.mask); err != nil {
			t.Fatalf("connect xrc: %v", err)
		}
	}
	// An XRC send QP takes no responder attributes: the table says so.
	bad := verbs.QPAttr{State: verbs.QPSRTS, CurState: verbs.QPSRTS, MinRNRTimer: 1}
	var te *verbs.TransitionError
	if err := ini.Modify(&bad, verbs.QPAttrState|verbs.QPAttrMinRNRTimer); !errors.As(err, &te) || te.Extra != verbs.QPAttrMinRNRTimer {
		t.Fatalf("MIN_RNR_TIMER on an XRC_INI QP: %v", err)
	}
}

// postXRecv posts one receive of n bytes at off of s's buffer to srq.
func postXRecv(t testing.TB, srq *verbs.SRQ, s *side, wrid uint64, off, n int) {
	t.Helper()
	check(t, srq.PostRecv(&verbs.RecvWR{WRID: wrid, SG: []verbs.SGE{s.mr.SGE(off, n)}}))
}

func testXRCSendRecv(t *testing.T, env Env) {
	p := newXRCPair(t, env)
	for i, n := range []int{0, 1, 1024, 5000} {
		postXRecv(t, p.srq, p.b, uint64(100+i), 0, 8192)
		fill(p.a.buf[:n], byte(i+1))
		check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{p.a.mr.SGE(0, n)}, RemoteSRQNum: p.srq.Num()}))
		pollOne(t, p.a.cq, verbs.WCSuccess, uint64(i))
		wc := pollOne(t, p.b.cq, verbs.WCSuccess, uint64(100+i))
		if wc.Opcode != verbs.WCRecv || wc.ByteLen != uint32(n) || wc.QPNum != p.tgt.Num() {
			t.Fatalf("receive completion %+v, want RECV of %d bytes on QP %#x", wc, n, p.tgt.Num())
		}
		if !bytes.Equal(p.b.buf[:n], p.a.buf[:n]) {
			t.Fatalf("%d bytes: data differs", n)
		}
	}
}

func testXRCSendWithImm(t *testing.T, env Env) {
	p := newXRCPair(t, env)
	postXRecv(t, p.srq, p.b, 7, 0, 64)
	copy(p.a.buf, "xrc!")
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSendWithImm, Imm: 0xdeadbeef,
		Flags: verbs.SendSignaled | verbs.SendInline, SG: []verbs.SGE{p.a.mr.SGE(0, 4)}, RemoteSRQNum: p.srq.Num()}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 1)
	wc := pollOne(t, p.b.cq, verbs.WCSuccess, 7)
	if wc.Flags&verbs.WCWithImm == 0 || wc.Imm != 0xdeadbeef || string(p.b.buf[:4]) != "xrc!" {
		t.Fatalf("receive %+v, data %q", wc, p.b.buf[:4])
	}
}

func testXRCRDMA(t *testing.T, env Env) {
	p := newXRCPair(t, env)
	srqn := p.srq.Num()
	// WRITE, then READ it back, then WRITE with immediate, which takes a
	// receive of the SRQ.
	fill(p.a.buf[:3000], 9)
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(0, 3000)}, RemoteAddr: p.b.mr.Addr() + 100, RKey: p.b.mr.RKey(), RemoteSRQNum: srqn}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 1)
	if !bytes.Equal(p.b.buf[100:3100], p.a.buf[:3000]) {
		t.Fatal("RDMA WRITE: data differs")
	}
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 2, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(4000, 3000)}, RemoteAddr: p.b.mr.Addr() + 100, RKey: p.b.mr.RKey(), RemoteSRQNum: srqn}))
	if wc := pollOne(t, p.a.cq, verbs.WCSuccess, 2); wc.Opcode != verbs.WCRDMARead || wc.ByteLen != 3000 {
		t.Fatalf("RDMA READ completion %+v", wc)
	}
	if !bytes.Equal(p.a.buf[4000:7000], p.a.buf[:3000]) {
		t.Fatal("RDMA READ: data differs")
	}
	postXRecv(t, p.srq, p.b, 9, 0, 0)
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMAWriteWithImm, Imm: 77, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(0, 10)}, RemoteAddr: p.b.mr.Addr() + 8000, RKey: p.b.mr.RKey(), RemoteSRQNum: srqn}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 3)
	wc := pollOne(t, p.b.cq, verbs.WCSuccess, 9)
	if wc.Opcode != verbs.WCRecvRDMAWithImm || wc.Imm != 77 || wc.ByteLen != 10 || wc.QPNum != p.tgt.Num() {
		t.Fatalf("WRITE with immediate completion %+v", wc)
	}
}

func testXRCAtomics(t *testing.T, env Env) {
	p := newXRCPair(t, env)
	target := p.b.buf[64:72]
	binary.NativeEndian.PutUint64(target, 5)
	raddr := p.b.mr.Addr() + 64
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRAtomicFetchAdd, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(0, 8)}, RemoteAddr: raddr, RKey: p.b.mr.RKey(), CompareAdd: 10, RemoteSRQNum: p.srq.Num()}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 1)
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 2, Opcode: verbs.WRAtomicCmpAndSwp, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(8, 8)}, RemoteAddr: raddr, RKey: p.b.mr.RKey(), CompareAdd: 15, Swap: 99, RemoteSRQNum: p.srq.Num()}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 2)
	if a, b, m := binary.NativeEndian.Uint64(p.a.buf[0:]), binary.NativeEndian.Uint64(p.a.buf[8:]), binary.NativeEndian.Uint64(target); a != 5 || b != 15 || m != 99 {
		t.Fatalf("fetch-add returned %d (want 5), cmp-swap %d (want 15), memory %d (want 99)", a, b, m)
	}
}

// testXRCPDOfNamedSRQ checks that RDMA over XRC is allowed by the PD of the
// SRQ the request names: a region of another PD is out of reach through
// an SRQ of the first, and in reach through an SRQ of its own PD.
func testXRCPDOfNamedSRQ(t *testing.T, env Env) {
	p := newXRCPair(t, env)
	pd2, err := p.b.ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, pd2.Close()) })
	buf2, err := verbs.Alloc(4096) // written by the device: outside the Go heap
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, verbs.Free(buf2)) })
	mr2, err := pd2.RegMR(buf2, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, mr2.Close()) })
	srq2, err := pd2.CreateXRCSRQ(p.xrcd, p.b.cq, verbs.SRQAttr{MaxWR: 4, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, srq2.Close()) })
	copy(p.a.buf, "pd two")
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(0, 6)}, RemoteAddr: mr2.Addr(), RKey: mr2.RKey(), RemoteSRQNum: srq2.Num()}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 1)
	if string(buf2[:6]) != "pd two" {
		t.Fatalf("region of the named SRQ's PD holds %q", buf2[:6])
	}
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 2, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(0, 6)}, RemoteAddr: mr2.Addr() + 100, RKey: mr2.RKey(), RemoteSRQNum: p.srq.Num()}))
	pollOne(t, p.a.cq, verbs.WCRemAccessErr, 2)
	if buf2[100] != 0 {
		t.Fatal("a region of another PD than the named SRQ's was written")
	}
}

// testXRCWrongDomain sends to an XRC SRQ of another domain: the receive QP
// refuses it (NAK), the sender's request completes in error, and no SRQ
// receives anything.
func testXRCWrongDomain(t *testing.T, env Env) {
	p := newXRCPair(t, env)
	other, err := p.b.ctx.OpenXRCD(nil, os.O_CREATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, other.Close()) })
	foreign := newXSRQ(t, p.b, other)
	postXRecv(t, foreign, p.b, 1, 0, 64)
	postXRecv(t, p.srq, p.b, 2, 0, 64)
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 5, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(0, 8)}, RemoteSRQNum: foreign.Num()}))
	wc := poll(t, p.a.cq, 1)[0]
	if wc.WRID != 5 || wc.Status != verbs.WCRemAccessErr {
		t.Fatalf("send to another domain's SRQ: %+v, want REM_ACCESS_ERR", wc)
	}
	noCompletion(t, p.b.cq, 50*time.Millisecond)
	waitState(t, p.tgt, verbs.QPSErr)
	// A receive QP has no CQ: its holders learn of the error by an
	// affiliated event, as mlx4 reports a responder's access error.
	if ev := waitAsync(t, p.b.ctx, verbs.EventQPAccessErr); ev.QP != p.tgt {
		t.Fatalf("QP_ACCESS_ERR of QP %v, want the receive QP", ev.QP)
	}
}

// testXRCRemovedDomainFile removes a domain's file while the domain lives:
// a new file is not in the domain, even where the file system would give
// it the old file's inode number (the kernel holds the old inode while the
// domain lives).
func testXRCRemovedDomainFile(t *testing.T, env Env) {
	_, cb := env.Open(t)
	skipWithoutXRC(t, cb)
	dir := t.TempDir()
	f1, err := os.Create(filepath.Join(dir, "job1"))
	if err != nil {
		t.Fatal(err)
	}
	x1, err := cb.OpenXRCD(f1, os.O_CREATE)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { check(t, x1.Close()) }()
	check(t, f1.Close())
	check(t, os.Remove(f1.Name()))
	for i := range 8 { // ext4 gives a removed file's inode number to the next file
		f2, err := os.Create(filepath.Join(dir, fmt.Sprintf("job%d", i+2)))
		if err != nil {
			t.Fatal(err)
		}
		_, err = cb.OpenXRCD(f2, 0)
		f2.Close()
		expectErrno(t, err, syscall.EAGAIN, "open, without O_CREATE, of a new file after the domain's was removed")
	}
}

// testXRCCQOverrun overruns the CQ of an XRC SRQ: the receive QP whose
// completion finds it overrun fails, as an RC QP on an overrun CQ does, and
// does not go on taking messages whose completions are lost. Another
// receive QP, whose last message went to that SRQ but completed before,
// goes on (hardware fails the QPs that write into the overrun CQ only).
func testXRCCQOverrun(t *testing.T, env Env) {
	o := defaultOpts()
	o.timeout, o.retryCnt = 12, 1 // 16.8 ms, once
	p := newXRCPairWith(t, env, o)
	cq, err := p.b.ctx.CreateCQ(1, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, cq.Close()) })
	srq, err := p.b.pd.CreateXRCSRQ(p.xrcd, cq, verbs.SRQAttr{MaxWR: 64, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, srq.Close()) })
	for i := range 64 {
		postXRecv(t, srq, p.b, uint64(i), i*64, 64)
	}
	send := func(qp *verbs.QP, wrid uint64, srqn uint32) {
		t.Helper()
		check(t, qp.PostSend(&verbs.SendWR{WRID: wrid, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{p.a.mr.SGE(0, 8)}, RemoteSRQNum: srqn}))
	}
	// The pair's receive QP: one message into the small CQ, polled.
	send(p.a.qp, 100, srq.Num())
	pollOne(t, p.a.cq, verbs.WCSuccess, 100)
	pollOne(t, cq, verbs.WCSuccess, 0)

	// A second pair overruns it. The CQ holds CQE()+1 completions (mlx4
	// reports one less than its entries): one message more overruns it,
	// and that one may be lost.
	ini, err := p.a.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTXRCIni, SendCQ: p.a.cq,
		Cap: verbs.QPCap{MaxSendWR: 64, MaxSendSGE: 4, MaxInlineData: 64}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, ini.Close()) })
	tgt, err := p.xrcd.CreateTgtQP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, tgt.Close()) })
	connectXRC(t, ini, tgt, p.a.port.GID, p.b.port.GID, o)
	n := cq.CQE() + 2
	for i := range n {
		send(ini, uint64(i), srq.Num())
		if wc := poll(t, p.a.cq, 1)[0]; wc.Status != verbs.WCSuccess && (i < n-1 || wc.Status != verbs.WCRetryExcErr) {
			t.Fatalf("message %d of %d: %v", i, n, wc.Status)
		}
	}
	waitAsync(t, p.b.ctx, verbs.EventCQErr)
	waitState(t, tgt, verbs.QPSErr)

	// The first receive QP, to an SRQ whose CQ is sound.
	postXRecv(t, p.srq, p.b, 7, 0, 64)
	send(p.a.qp, 101, p.srq.Num())
	pollOne(t, p.a.cq, verbs.WCSuccess, 101)
	pollOne(t, p.b.cq, verbs.WCSuccess, 7)
}

// testXRCNoReceiveQueue checks what an XRC send QP cannot do: receive.
func testXRCNoReceiveQueue(t *testing.T, env Env) {
	p := newXRCPair(t, env)
	err := p.a.qp.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{p.a.mr.SGE(0, 8)}})
	var pe *verbs.PostError
	if !errors.As(err, &pe) || pe.Index != 0 {
		t.Fatalf("post recv on an XRC send QP: %v", err)
	}
	_, err = p.a.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTXRCIni, SendCQ: p.a.cq, RecvCQ: p.a.cq})
	expectErrno(t, err, syscall.EINVAL, "XRC_INI QP with a receive CQ")
	_, err = p.b.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: p.b.cq, RecvCQ: p.b.cq, SRQ: p.srq})
	expectErrno(t, err, syscall.EINVAL, "RC QP on an XRC SRQ")
	if err := p.tgt.PostSend(&verbs.SendWR{}); err == nil {
		t.Fatal("post send on an XRC receive QP succeeded")
	}
	expectErrno(t, p.xrcd.Close(), syscall.EBUSY, "close of a domain in use")
	expectErrno(t, p.b.cq.Close(), syscall.EBUSY, "close of an XRC SRQ's CQ")
}

// testXRCSharedDomain opens one file's domain twice: the second opener
// reaches the first's receive QP and SRQ numbers; O_EXCL and a missing
// O_CREATE fail as the kernel fails them.
func testXRCSharedDomain(t *testing.T, env Env) {
	_, cb := env.Open(t)
	skipWithoutXRC(t, cb)
	f, err := os.Create(filepath.Join(t.TempDir(), "domain"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = cb.OpenXRCD(f, 0)
	expectErrno(t, err, syscall.EAGAIN, "open of a file without a domain, without O_CREATE")
	x1, err := cb.OpenXRCD(f, os.O_CREATE|os.O_EXCL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { check(t, x1.Close()) }()
	_, err = cb.OpenXRCD(f, os.O_CREATE|os.O_EXCL)
	expectErrno(t, err, syscall.EINVAL, "O_EXCL open of a file with a domain")
	f2, err := os.Open(f.Name()) // another descriptor of the same file
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	x2, err := cb.OpenXRCD(f2, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { check(t, x2.Close()) }()
	tgt, err := x1.CreateTgtQP()
	if err != nil {
		t.Fatal(err)
	}
	opened, err := x2.OpenQP(tgt.Num())
	if err != nil {
		t.Fatalf("open of the receive QP through the other handle: %v", err)
	}
	check(t, opened.Close())
	check(t, tgt.Close())
	// A private domain does not see it.
	priv, err := cb.OpenXRCD(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { check(t, priv.Close()) }()
	tgt, err = x1.CreateTgtQP()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { check(t, tgt.Close()) }()
	_, err = priv.OpenQP(tgt.Num())
	expectErrno(t, err, syscall.EINVAL, "open of another domain's receive QP")
}

// testXRCOpenQP shares the receive QP: it keeps working after its creator
// closes it, while an opener holds it, and is gone with the last opener.
func testXRCOpenQP(t *testing.T, env Env) {
	p := newXRCPair(t, env)
	num := p.tgt.Num()
	opener, err := p.xrcd.OpenQP(num)
	if err != nil {
		t.Fatal(err)
	}
	if a, _, err := opener.Query(verbs.QPAttrState); err != nil || a.State != verbs.QPSRTR {
		t.Fatalf("opened QP: state %v, %v", a.State, err)
	}
	check(t, p.tgt.Close()) // the creator lets go
	postXRecv(t, p.srq, p.b, 1, 0, 64)
	copy(p.a.buf, "still open")
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(0, 10)}, RemoteSRQNum: p.srq.Num()}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 2)
	if wc := pollOne(t, p.b.cq, verbs.WCSuccess, 1); wc.QPNum != num || string(p.b.buf[:10]) != "still open" {
		t.Fatalf("receive %+v of %q", wc, p.b.buf[:10])
	}
	check(t, opener.Close()) // the last opener: the QP goes
	_, err = p.xrcd.OpenQP(num)
	expectErrno(t, err, syscall.EINVAL, "open of a receive QP whose openers all closed it")
}
