//go:build linux

package softhca

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/uverbs"
	"github.com/xrcrun/xrc/softhca/roce"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// These tests drive one device with packets made by hand, from a peer on
// the fabric (the sink) whose engine never runs: what the device sends piles
// up for the test to read.

func newSink(t testing.TB, f *Fabric, a string) *Device {
	s := &Device{name: "sink", gid: netip.MustParseAddr(a).As16()}
	s.eng = newEngine(s, 0, false, Faults{})
	if _, err := f.attach(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *Device) drain() []*roce.Packet {
	s.eng.qmu.Lock()
	defer s.eng.qmu.Unlock()
	p := s.eng.rx
	s.eng.rx = nil
	return p
}

// collect waits until at least n packets came to the sink and returns them
// all.
func (s *Device) collect(t *testing.T, n int) []*roce.Packet {
	t.Helper()
	var got []*roce.Packet
	waitFor(t, fmt.Sprintf("%d packets", n), func() bool {
		got = append(got, s.drain()...)
		return len(got) >= n
	})
	return got
}

// waitFor polls cond until it holds, for up to 10 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 10 seconds", what)
		}
	}
}

type rig struct {
	d, sink *Device
	ctx     *verbs.Context
	pd      *verbs.PD
	cq      *verbs.CQ
	buf     []byte
	mr      *verbs.MR
	qp      *verbs.QP
}

func newRig(t *testing.T) *rig { return newRigWith(t, verbstest.Options{}) }

// newRigWith is newRig with the QP's attributes changed by opt.
func newRigWith(t *testing.T, opt verbstest.Options) *rig { return newRigAll(t, opt, false) }

// newRigAll is newRigWith, where the device reaches the client's memory
// with process_vm_readv/writev if noViews (Device.noViews).
func newRigAll(t *testing.T, opt verbstest.Options, noViews bool) *rig {
	f := NewFabric()
	d, err := New(context.Background(), Config{Name: "rv0", Addr: netip.MustParseAddr("127.7.0.1"), Fabric: f})
	if err != nil {
		t.Fatal(err)
	}
	d.noViews = noViews
	t.Cleanup(func() { d.Close() })
	r := &rig{d: d, sink: newSink(t, f, "127.7.0.2")}
	if r.ctx, err = d.Open(verbs.Config{}); err != nil {
		t.Fatal(err)
	}
	if r.pd, err = r.ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if r.cq, err = r.ctx.CreateCQ(256, nil, 0); err != nil {
		t.Fatal(err)
	}
	if r.buf, err = verbs.Alloc(1 << 20); err != nil {
		t.Fatal(err)
	}
	if r.mr, err = r.pd.RegMR(r.buf, verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	if r.qp, err = r.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: r.cq, RecvCQ: r.cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 3, MaxRecvSGE: 1}}); err != nil {
		t.Fatal(err)
	}
	verbstest.BringUpWith(t, r.qp, r.sink.gid, 0x999, opt)
	return r
}

func (r *rig) inject(fill func(p *roce.Packet)) {
	p := getPacket()
	p.SrcGID, p.DstGID, p.DestQP, p.PKey = r.sink.gid, r.d.gid, r.qp.Num(), 0xffff
	fill(p)
	r.d.eng.deliver(p)
}

func pollWait(t *testing.T, cq *verbs.CQ) verbs.WorkCompletion {
	wc := make([]verbs.WorkCompletion, 1)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if n, _ := cq.Poll(wc); n == 1 {
			return wc[0]
		}
		time.Sleep(100 * time.Microsecond)
	}
	t.Fatal("no completion")
	return wc[0]
}

// An ACK for a PSN the requester never sent does not complete the send.
func TestAckBeyondSentIsIgnored(t *testing.T) {
	r := newRig(t)
	if err := r.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{r.mr.SGE(0, 1<<20)}}); err != nil {
		t.Fatal(err)
	}
	sent := len(r.sink.collect(t, 1))
	r.inject(func(p *roce.Packet) { p.Opcode, p.PSN, p.Syndrome = roce.Acknowledge, 0x1234+1023, roce.AETHAck })
	wc := pollWait(t, r.cq)
	t.Logf("packets sent %d of 1024; completion %v", sent, wc.Status)
	if sent >= 1024 {
		t.Fatalf("the whole message went out before the first ACK (%d packets): the test proves nothing", sent)
	}
	if wc.Status == verbs.WCSuccess {
		t.Errorf("send completed successfully after only %d of its 1024 packets were transmitted", sent)
	}
}

// A duplicate READ is checked against the regions again: once the region is
// gone it is answered with a remote access NAK, not with memory.
func TestDuplicateReadRevalidatesRKey(t *testing.T) {
	r := newRig(t)
	copy(r.buf, bytes.Repeat([]byte{'A'}, 16))
	va, rkey := r.mr.Addr(), r.mr.RKey()
	read := func() {
		r.inject(func(p *roce.Packet) {
			p.Opcode, p.PSN, p.VA, p.RKey, p.DMALen, p.AckReq = roce.ReadRequest, 0x1234, va, rkey, 16, true
		})
	}
	read()
	for _, p := range r.sink.collect(t, 1) {
		t.Logf("first: %v psn %#x %q", p.Opcode, p.PSN, p.Payload)
	}
	if err := r.mr.Close(); err != nil {
		t.Fatal(err)
	}
	copy(r.buf, bytes.Repeat([]byte{'S'}, 16)) // not registered any more
	read()
	dup := r.sink.collect(t, 1)
	if len(dup) != 1 || dup[0].Opcode != roce.Acknowledge || dup[0].Syndrome != roce.AETHNak|roce.NakRemoteAccess {
		for _, p := range dup {
			t.Logf("duplicate: %v psn %#x syndrome %#x %q", p.Opcode, p.PSN, p.Syndrome, p.Payload)
		}
		t.Fatalf("duplicate READ after deregistration: %d packets, want one remote access NAK", len(dup))
	}
}

// A CQ that overruns while the QPs of another overrun CQ are flushed fails
// its own users too.
func TestCascadedCQOverrun(t *testing.T) {
	r := newRig(t)
	cq1, _ := r.ctx.CreateCQ(1, nil, 0)
	cq2, _ := r.ctx.CreateCQ(3, nil, 0)
	a, err := r.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: cq1, RecvCQ: cq2,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: cq2, RecvCQ: cq2,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	verbstest.BringUp(t, a, r.sink.gid, 0x999)
	verbstest.BringUp(t, b, r.sink.gid, 0x998)
	for i := range 5 {
		if err := a.PostRecv(&verbs.RecvWR{WRID: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if err := a.PostSend(&verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{r.mr.SGE(0, 8)}}); err != nil {
			t.Fatal(err)
		}
	}
	r.sink.collect(t, 3)
	p := getPacket()
	p.SrcGID, p.DstGID, p.DestQP, p.Opcode, p.PSN = r.sink.gid, r.d.gid, a.Num(), roce.Acknowledge, 0x1234+2
	r.d.eng.deliver(p)
	// A's send CQ overruns, A's flush overruns cq2, and cq2's other
	// user B fails too.
	waitFor(t, "A, B and cq2 in error", func() bool {
		sa, _, _ := a.Query(verbs.QPAttrState)
		sb, _, _ := b.Query(verbs.QPAttrState)
		r.d.mu.Lock()
		e2 := r.d.cqs[3].errored
		r.d.mu.Unlock()
		return sa.State == verbs.QPSErr && sb.State == verbs.QPSErr && e2
	})
}

// A READ response that arrives after the local region was deregistered is
// not scattered: the READ fails with a local protection error.
func TestReadResponseIntoDeregisteredMR(t *testing.T) {
	r := newRig(t)
	if err := r.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{r.mr.SGE(0, 16)}, RemoteAddr: 0x1000, RKey: 0x77}); err != nil {
		t.Fatal(err)
	}
	r.sink.collect(t, 1)
	if err := r.mr.Close(); err != nil {
		t.Fatal(err)
	}
	r.inject(func(p *roce.Packet) {
		p.Opcode, p.PSN, p.Syndrome = roce.ReadResponseOnly, 0x1234, roce.AETHAck
		p.Payload = append(p.Payload[:0], bytes.Repeat([]byte{'X'}, 16)...)
	})
	wc := pollWait(t, r.cq)
	t.Logf("completion %v, buf %q", wc.Status, r.buf[:16])
	if wc.Status != verbs.WCLocProtErr {
		t.Errorf("READ into a deregistered region completed with %v, want %v", wc.Status, verbs.WCLocProtErr)
	}
	if bytes.Equal(r.buf[:16], bytes.Repeat([]byte{'X'}, 16)) {
		t.Errorf("device wrote into memory whose region was deregistered")
	}
}

// A DESTROY whose response buffer is too small fails with ENOSPC before it
// destroys anything.
func TestDestroyWithoutResponseRoom(t *testing.T) {
	d, c, _ := testClient(t)
	mustW := func(b []byte) {
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	mustW(frame(uverbs.CmdGetContext, &uverbs.Cmd[uverbs.GetContext]{}, 32))
	mustW(frame(uverbs.CmdCreateCQ, &mlx4abi.CreateCQ{
		Core: uverbs.CreateCQ{CQE: 7, CompChannel: -1}, Drv: mlx4abi.IBCreateCQ{BufAddr: cqAddr, DBAddr: cqDB}}, 16)) // handle 1
	_, err := c.Write(frame(uverbs.CmdDestroyCQ, &uverbs.Cmd[uverbs.DestroyCQ]{Core: uverbs.DestroyCQ{CQHandle: 1}}, 0))
	t.Logf("DESTROY_CQ without response room: %v; CQs left %d", err, d.Objects().CQs)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("DESTROY_CQ without response room: %v, want ENOSPC", err)
	}
	if d.Objects().CQs != 1 {
		t.Errorf("DESTROY_CQ failed (%v) but destroyed the CQ", err)
	}
}

// A READ response for a READ still queued behind a long SEND, not yet
// requested, is dropped.
func TestResponseToUnsentRead(t *testing.T) {
	r := newRig(t)
	if err := r.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SG: []verbs.SGE{r.mr.SGE(4096, 512<<10)},
		Next: &verbs.SendWR{WRID: 2, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{r.mr.SGE(0, 16)}, RemoteAddr: 0x1000, RKey: 0x77}}); err != nil {
		t.Fatal(err)
	}
	var reads int
	for _, p := range r.sink.collect(t, 64) { // the first window of the SEND
		if p.Opcode == roce.ReadRequest {
			reads++
		}
	}
	r.inject(func(p *roce.Packet) {
		p.Opcode, p.PSN, p.Syndrome = roce.ReadResponseOnly, 0x1234+512, roce.AETHAck
		p.Payload = append(p.Payload[:0], bytes.Repeat([]byte{'G'}, 16)...)
	})
	waitFor(t, "dropped response", func() bool { return r.d.counters.RcvErrors.Load() > 0 })
	r.d.mu.Lock()
	var rd int
	for q := range r.d.qps.all {
		rd = int(q.req.rdAtomic)
	}
	r.d.mu.Unlock()
	t.Logf("READ requests sent before: %d; buf %q; rdAtomic %d", reads, r.buf[:16], rd)
	if reads != 0 {
		t.Fatalf("the READ was requested before the SEND finished (%d requests): the test proves nothing", reads)
	}
	if bytes.Equal(r.buf[:16], bytes.Repeat([]byte{'G'}, 16)) || rd != 0 {
		t.Errorf("response to a READ never sent was scattered into local memory")
	}
}

// A NAK for a request past a READ whose response never came says the
// response was lost: the READ is asked for again, and the NAK, for a
// request the responder has yet to get to again, fails nothing (before, the
// READ completed with a flush error and then the atomic with the NAK's
// error, out of order). Found by FuzzDatagram.
func TestNakPastUnansweredRead(t *testing.T) {
	r := newRig(t)
	if err := r.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{r.mr.SGE(0, 16)}, RemoteAddr: 0x1000, RKey: 0x77,
		Next: &verbs.SendWR{WRID: 2, Opcode: verbs.WRAtomicFetchAdd, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{r.mr.SGE(64, 8)}, RemoteAddr: 0x2000, RKey: 0x77, CompareAdd: 1}}); err != nil {
		t.Fatal(err)
	}
	r.sink.collect(t, 2)
	r.inject(func(p *roce.Packet) {
		p.Opcode, p.PSN, p.Syndrome = roce.Acknowledge, 0x1235, roce.AETHNak|roce.NakInvalidRequest
	})
	again := r.sink.collect(t, 1)
	if again[0].Opcode != roce.ReadRequest || again[0].PSN != 0x1234 {
		t.Fatalf("after the NAK: %v PSN %#x, want the READ again", again[0].Opcode, again[0].PSN)
	}
	wc := make([]verbs.WorkCompletion, 2)
	if n, _ := r.cq.Poll(wc); n != 0 {
		t.Fatalf("completions after a NAK past an unanswered READ: %+v", wc[:n])
	}
}

// A request that fails after a READ in the same round is NAKed after the
// READ's responses, not before them: responses go in the order of the
// requests, and a NAK first would tell the requester the READ's responses
// were lost. Found by FuzzDatagram.
func TestNakAfterReadResponses(t *testing.T) {
	r := newRig(t)
	read, write := getPacket(), getPacket()
	for _, p := range []*roce.Packet{read, write} {
		p.SrcGID, p.DstGID, p.DestQP, p.PKey = r.sink.gid, r.d.gid, r.qp.Num(), 0xffff
	}
	read.Opcode, read.PSN, read.VA, read.RKey, read.DMALen = roce.ReadRequest, 0x1234, r.mr.Addr(), r.mr.RKey(), 4096
	write.Opcode, write.PSN, write.VA, write.RKey, write.DMALen = roce.WriteOnly, 0x1234+4, 0x1000, 0x77, 8
	write.Payload = append(write.Payload[:0], "12345678"...)
	r.d.eng.deliverAll([]*roce.Packet{read, write})
	got := r.sink.collect(t, 5)
	for i, p := range got {
		t.Logf("%v PSN %#x syndrome %#x", p.Opcode, p.PSN, p.Syndrome)
		if want := i == 4; (p.Opcode == roce.Acknowledge) != want {
			t.Errorf("packet %d is %v: want 4 READ responses, then the NAK", i, p.Opcode)
		}
	}
	if last := got[len(got)-1]; last.Syndrome != roce.AETHNak|roce.NakRemoteAccess || last.PSN != 0x1238 {
		t.Errorf("last packet: syndrome %#x PSN %#x, want a remote access NAK for PSN 0x1238", last.Syndrome, last.PSN)
	}
}

// A copy of a sequence NAK, which a lossy network may duplicate or hold
// back, coming after the requester went back for the first one, tells it
// nothing: it costs no retry and sends nothing again. With retry_cnt 1 the
// copy used to fail the send with RETRY_EXC_ERR, and under 10% loss with
// duplication such copies exhausted retry_cnt 7 now and then
// (TestLossyLink).
func TestDuplicateSequenceNak(t *testing.T) {
	r := newRigWith(t, verbstest.Options{RetryCnt: 1})
	if err := r.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{r.mr.SGE(0, 3000)}}); err != nil { // three packets at MTU 1024
		t.Fatal(err)
	}
	r.sink.collect(t, 3)
	nak := func(p *roce.Packet) {
		p.Opcode, p.PSN, p.Syndrome = roce.Acknowledge, 0x1235, roce.AETHNak|roce.NakPSNSeqErr
	}
	r.inject(nak)
	again := r.sink.collect(t, 2)
	if again[0].PSN != 0x1235 || again[1].PSN != 0x1236 {
		t.Fatalf("after the NAK the requester sent PSNs %#x, %#x; want 0x1235, 0x1236", again[0].PSN, again[1].PSN)
	}
	r.inject(nak) // the copy
	r.inject(func(p *roce.Packet) { p.Opcode, p.PSN, p.Syndrome = roce.Acknowledge, 0x1236, roce.AETHAck })
	if wc := pollWait(t, r.cq); wc.Status != verbs.WCSuccess || wc.WRID != 1 {
		t.Fatalf("completion %+v, want the send to succeed", wc)
	}
	if n := r.d.counters.Retransmits.Load(); n != 2 {
		t.Errorf("%d packets sent again, want the 2 the first NAK asked for", n)
	}
}

// Each duplicate of a SEND packet is acknowledged again (C9-105), not once
// for all the duplicates of a round: after a timeout a requester sends its
// window again, and every acknowledgement is a chance to get through a
// lossy link.
func TestEachDuplicateAcknowledged(t *testing.T) {
	r := newRig(t)
	if err := r.qp.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{r.mr.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	send := func(p *roce.Packet) {
		p.Opcode, p.PSN, p.AckReq = roce.TransportRC|roce.SendOnly, 0x1234, true
		p.Payload = append(p.Payload, "8 bytes!"...)
	}
	r.inject(send)
	if wc := pollWait(t, r.cq); wc.Status != verbs.WCSuccess || wc.ByteLen != 8 {
		t.Fatalf("receive completion %+v", wc)
	}
	if first := r.sink.collect(t, 1); first[0].Opcode != roce.Acknowledge || first[0].PSN != 0x1234 {
		t.Fatalf("answer to the SEND: %v PSN %#x", first[0].Opcode, first[0].PSN)
	}
	r.d.mu.Lock() // the three copies come in one round
	for range 3 {
		r.inject(send)
	}
	r.d.mu.Unlock()
	acks := r.sink.collect(t, 3)
	for _, a := range acks {
		if a.Opcode != roce.Acknowledge || a.PSN != 0x1234 || a.Syndrome&roce.AETHKind != roce.AETHAck {
			t.Fatalf("answer to a duplicate: %v PSN %#x syndrome %#x, want an ACK of 0x1234", a.Opcode, a.PSN, a.Syndrome)
		}
	}
	if n := r.d.counters.DuplicateRequest.Load(); n != 3 {
		t.Errorf("%d duplicates counted, want 3", n)
	}
}

// A packet the fault injector holds back to reorder it goes after the next
// packet of the engine's round, or at the round's end: a lone packet is
// late, not lost until the device next sends something.
func TestReorderedLonePacketArrives(t *testing.T) {
	r := newRig(t)
	r.d.SetFaults(Faults{Reorder: 1, Seed: 1})
	if err := r.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SG: []verbs.SGE{r.mr.SGE(0, 8)}}); err != nil {
		t.Fatal(err)
	}
	if got := r.sink.collect(t, 1); got[0].Opcode.Op() != roce.SendOnly {
		t.Fatalf("sent %v, want the SEND", got[0].Opcode)
	}
	// The SEND was held back, and perhaps retransmissions of it (nobody
	// acknowledges it; on a loaded machine the transport timer may fire
	// before the counters are read), nothing else.
	n := r.d.counters.FaultReorders.Load()
	re := r.d.counters.Retransmits.Load() // after: a resent packet is counted before it is held back
	if n < 1 || n > 1+re {
		t.Errorf("%d packets held back, want 1 and at most the %d retransmissions", n, re)
	}
}
