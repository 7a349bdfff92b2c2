//go:build linux

package softhca

import (
	"bytes"
	"testing"

	"github.com/xrcrun/xrc/softhca/roce"
	"github.com/xrcrun/xrc/verbs"
)

// These tests check RC rules of the requester and the responder with
// packets made by hand (inject_test.go's rig). Their QPs have no transport
// timer (timeout 0), so that what they wait for comes from the rule under
// test, or never.

// noTimer takes the transport timer off the rig's QP, and sets its RNR
// retries.
func (r *rig) noTimer(rnrRetry uint8) {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	for q := range r.d.qps.all {
		q.timeout = 0
		q.rnrRetry, q.req.rnrLeft = rnrRetry, rnrRetry
	}
}

// sent is a packet the rig's QP sent: its opcode and PSN.
type sent struct {
	op  roce.Opcode
	psn uint32
}

// wantSent waits for the packets the rig's QP sends next, and checks them.
func (r *rig) wantSent(t *testing.T, want ...sent) {
	t.Helper()
	got := r.sink.collect(t, len(want))
	for i, p := range got {
		if i >= len(want) || p.Opcode != want[i].op || p.PSN != want[i].psn {
			t.Fatalf("sent %v PSN %#x, want %v", p.Opcode, p.PSN, want)
		}
	}
}

func (r *rig) wantWC(t *testing.T, wrid uint64, st verbs.WCStatus) {
	t.Helper()
	if wc := pollWait(t, r.cq); wc.WRID != wrid || wc.Status != st {
		t.Fatalf("completion of %d with %v, want %d with %v", wc.WRID, wc.Status, wrid, st)
	}
}

// carrying fills in a packet with a payload: a request, or a READ
// response (an ACK).
func carrying(op roce.Opcode, psn uint32, b []byte) func(p *roce.Packet) {
	return func(p *roce.Packet) {
		p.Opcode, p.PSN = op, psn
		if op.IsResponse() {
			p.Syndrome = roce.AETHAck
		}
		p.Payload = append(p.Payload[:0], b...)
	}
}

func atomicAck(psn uint32, orig uint64) func(p *roce.Packet) {
	return func(p *roce.Packet) {
		p.Opcode, p.PSN, p.Syndrome, p.OrigData = roce.AtomicAcknowledge, psn, roce.AETHAck, orig
	}
}

// TestImpliedNakFromResponses: a response past a READ or an atomic whose
// own response has not come says that one was lost (IBA 9.7.5.1.1, an
// implied NAK), whatever kind of response it is: the READ or atomic is sent
// again at once, once however many such responses come. Before, an atomic
// response past a READ was dropped as an error and a READ response past an
// atomic dropped unseen, and the QP waited for its transport timer (with
// timeout 0, forever).
func TestImpliedNakFromResponses(t *testing.T) {
	read := func(wrid uint64, next *verbs.SendWR) *verbs.SendWR {
		return &verbs.SendWR{WRID: wrid, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{{}}, RemoteAddr: 0x1000, RKey: 0x77, Next: next}
	}
	fetchAdd := func(wrid uint64, next *verbs.SendWR) *verbs.SendWR {
		return &verbs.SendWR{WRID: wrid, Opcode: verbs.WRAtomicFetchAdd, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{{}}, RemoteAddr: 0x2000, RKey: 0x77, CompareAdd: 1, Next: next}
	}
	data := bytes.Repeat([]byte{'G'}, 16)
	t.Run("AtomicPastRead", func(t *testing.T) {
		r := newRig(t)
		r.noTimer(7)
		wr := read(1, fetchAdd(2, nil))
		wr.SG[0], wr.Next.SG[0] = r.mr.SGE(0, 16), r.mr.SGE(64, 8)
		if err := r.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		r.sink.collect(t, 2)
		r.inject(atomicAck(0x1235, 42))
		r.inject(atomicAck(0x1235, 42))
		r.wantSent(t, sent{roce.ReadRequest, 0x1234}, sent{roce.FetchAdd, 0x1235})
		if n := r.d.counters.ImpliedNakSeqErr.Load(); n != 1 {
			t.Errorf("%d implied NAKs, want 1", n)
		}
		r.inject(carrying(roce.ReadResponseOnly, 0x1234, data))
		r.inject(atomicAck(0x1235, 42))
		r.wantWC(t, 1, verbs.WCSuccess)
		r.wantWC(t, 2, verbs.WCSuccess)
		if !bytes.Equal(r.buf[:16], data) || r.buf[64] != 42 {
			t.Errorf("the READ's data %q, the atomic's %d", r.buf[:16], r.buf[64])
		}
	})
	t.Run("ReadPastAtomic", func(t *testing.T) {
		r := newRig(t)
		r.noTimer(7)
		wr := fetchAdd(1, read(2, nil))
		wr.SG[0], wr.Next.SG[0] = r.mr.SGE(64, 8), r.mr.SGE(0, 16)
		if err := r.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		r.sink.collect(t, 2)
		r.inject(carrying(roce.ReadResponseOnly, 0x1235, data))
		r.inject(carrying(roce.ReadResponseOnly, 0x1235, data))
		r.wantSent(t, sent{roce.FetchAdd, 0x1234}, sent{roce.ReadRequest, 0x1235})
		if n := r.d.counters.ImpliedNakSeqErr.Load(); n != 1 {
			t.Errorf("%d implied NAKs, want 1", n)
		}
		r.inject(atomicAck(0x1234, 42))
		r.inject(carrying(roce.ReadResponseOnly, 0x1235, data))
		r.wantWC(t, 1, verbs.WCSuccess)
		r.wantWC(t, 2, verbs.WCSuccess)
	})
}

// TestReadResponseSequence: a READ's responses come FIRST, MIDDLE…, LAST,
// or ONLY; any other order is a bad response, which fails the READ.
// Before, FIRST and MIDDLE for a READ of two packets filled it and left it
// waiting for ever (with a timer, its retry asked for 0 bytes at the PSN
// after the READ's, the next request's). After a lost response the rest is
// asked for again, and there the packet of the first answer may still come,
// late: either is taken.
func TestReadResponseSequence(t *testing.T) {
	page := bytes.Repeat([]byte{'R'}, 1024) // the rig's MTU
	for _, tc := range []struct {
		name string
		ops  []roce.Opcode
		ok   bool
	}{
		{"FirstLast", []roce.Opcode{roce.ReadResponseFirst, roce.ReadResponseLast}, true},
		{"FirstMiddle", []roce.Opcode{roce.ReadResponseFirst, roce.ReadResponseMiddle}, false},
		{"MiddleLast", []roce.Opcode{roce.ReadResponseMiddle, roce.ReadResponseLast}, false},
		{"FirstFirst", []roce.Opcode{roce.ReadResponseFirst, roce.ReadResponseFirst}, false},
		{"FirstOnly", []roce.Opcode{roce.ReadResponseFirst, roce.ReadResponseOnly}, false},
		{"Only", []roce.Opcode{roce.ReadResponseOnly}, false}, // a READ of 2048 bytes
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			r.noTimer(7)
			if err := r.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
				SG: []verbs.SGE{r.mr.SGE(0, 2048)}, RemoteAddr: 0x1000, RKey: 0x77}); err != nil {
				t.Fatal(err)
			}
			r.sink.collect(t, 1)
			for i, op := range tc.ops {
				r.inject(carrying(op, 0x1234+uint32(i), page))
			}
			want := verbs.WCBadRespErr
			if tc.ok {
				want = verbs.WCSuccess
			}
			r.wantWC(t, 1, want)
		})
	}
	for _, late := range []bool{false, true} {
		name := map[bool]string{false: "AskedAgain", true: "AskedAgainLateAnswer"}[late]
		t.Run(name, func(t *testing.T) {
			r := newRig(t)
			r.noTimer(7)
			if err := r.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
				SG: []verbs.SGE{r.mr.SGE(0, 3072)}, RemoteAddr: 0x1000, RKey: 0x77}); err != nil {
				t.Fatal(err)
			}
			r.sink.collect(t, 1)
			r.inject(carrying(roce.ReadResponseFirst, 0x1234, page))
			r.inject(carrying(roce.ReadResponseLast, 0x1236, page)) // 0x1235 lost
			again := r.sink.collect(t, 1)
			if again[0].Opcode != roce.ReadRequest || again[0].PSN != 0x1235 || again[0].DMALen != 2048 {
				t.Fatalf("asked again: %v PSN %#x for %d bytes", again[0].Opcode, again[0].PSN, again[0].DMALen)
			}
			// A response past the one expected is an implied NAK
			// sequence error in the IBA's terms (implied_nak_seq_err);
			// packet_seq_err counts the sequence error NAKs received.
			c := r.d.Counters()
			if implied, seq := c.ImpliedNakSeqErr.Load(), c.PacketSeqErr.Load(); implied != 1 || seq != 0 {
				t.Errorf("implied_nak_seq_err %d, packet_seq_err %d; want 1 and 0", implied, seq)
			}
			op := roce.ReadResponseFirst // the answer to the new request
			if late {
				op = roce.ReadResponseMiddle // the first answer's, late
			}
			r.inject(carrying(op, 0x1235, page))
			r.inject(carrying(roce.ReadResponseLast, 0x1236, page))
			r.wantWC(t, 1, verbs.WCSuccess)
		})
	}
}

// TestRNRNakCopies: an RNR NAK that comes again while the requester waits
// after it (the network duplicated or delayed it) costs no retry, and an
// acknowledgement of what it refused ends the wait. Before, the copy used
// up a retry (with rnr_retry 1 the SEND failed), and after the
// acknowledgement the QP sent nothing more: the wait stayed, with no timer
// to end it.
func TestRNRNakCopies(t *testing.T) {
	send := func(r *rig, wrid uint64) {
		if err := r.qp.PostSend(&verbs.SendWR{WRID: wrid, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{r.mr.SGE(0, 8)}}); err != nil {
			t.Fatal(err)
		}
	}
	rnr := func(timer uint8) func(p *roce.Packet) {
		return func(p *roce.Packet) { p.Opcode, p.PSN, p.Syndrome = roce.Acknowledge, 0x1234, roce.AETHRNRNak|timer }
	}
	ack := func(psn uint32) func(p *roce.Packet) {
		return func(p *roce.Packet) { p.Opcode, p.PSN, p.Syndrome = roce.Acknowledge, psn, roce.AETHAck }
	}
	t.Run("Copy", func(t *testing.T) {
		r := newRig(t)
		r.noTimer(1)
		send(r, 1)
		r.sink.collect(t, 1)
		r.inject(rnr(14)) // 1.92 ms
		r.inject(rnr(14))
		r.wantSent(t, sent{roce.SendOnly, 0x1234})
		r.inject(ack(0x1234))
		r.wantWC(t, 1, verbs.WCSuccess)
	})
	t.Run("AckDuringWait", func(t *testing.T) {
		r := newRig(t)
		r.noTimer(7)
		send(r, 1)
		r.sink.collect(t, 1)
		r.inject(rnr(31)) // 491 ms
		r.inject(ack(0x1234))
		r.wantWC(t, 1, verbs.WCSuccess)
		send(r, 2)
		r.wantSent(t, sent{roce.SendOnly, 0x1235})
	})
}

// TestPKeyChecked: a packet whose P_Key does not match the port's (the
// default partition's) is dropped and counted, not carried out.
func TestPKeyChecked(t *testing.T) {
	r := newRig(t)
	if err := r.qp.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{r.mr.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	send := func(pkey uint16, b string) {
		r.inject(func(p *roce.Packet) {
			p.Opcode, p.PSN, p.PKey = roce.SendOnly, 0x1234, pkey
			p.Payload = append(p.Payload[:0], b...)
		})
	}
	send(0x0000, "bad!")
	send(0x8001, "bad!")
	send(0x7fff, "good") // a limited member of the default partition
	r.sink.collect(t, 1) // its acknowledgement
	if wc := pollWait(t, r.cq); wc.Status != verbs.WCSuccess || string(r.buf[:4]) != "good" {
		t.Fatalf("received %q (%v)", r.buf[:4], wc.Status)
	}
	if n := r.d.counters.RcvErrors.Load(); n != 2 {
		t.Errorf("%d receive errors, want 2", n)
	}
}

// TestResponderRefuses: a READ or atomic to a QP with no responder
// resources (max_dest_rd_atomic 0), a LAST packet with no payload, and a
// SEND with Invalidate (the device has nothing to invalidate) are invalid
// requests: NAKed, not carried out. All were carried out (the last as a
// plain SEND).
func TestResponderRefuses(t *testing.T) {
	invalid := func(t *testing.T, r *rig) {
		t.Helper()
		got := r.sink.collect(t, 1)
		if got[0].Opcode != roce.Acknowledge || got[0].Syndrome != roce.AETHNak|roce.NakInvalidRequest {
			t.Fatalf("answered %v syndrome %#x, want an invalid request NAK", got[0].Opcode, got[0].Syndrome)
		}
	}
	for _, op := range []roce.Opcode{roce.ReadRequest, roce.FetchAdd} {
		t.Run(op.String(), func(t *testing.T) {
			r := newRig(t)
			r.d.mu.Lock()
			for q := range r.d.qps.all {
				q.maxDestRdAtomic = 0
			}
			r.d.mu.Unlock()
			mr, err := r.pd.RegMR(r.buf, verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic)
			if err != nil {
				t.Fatal(err)
			}
			r.inject(func(p *roce.Packet) {
				p.Opcode, p.PSN, p.VA, p.RKey, p.DMALen = op, 0x1234, mr.Addr(), mr.RKey(), 8
			})
			invalid(t, r)
		})
	}
	t.Run("SendWithInvalidate", func(t *testing.T) {
		r := newRig(t)
		if err := r.qp.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{r.mr.SGE(0, 4096)}}); err != nil {
			t.Fatal(err)
		}
		r.inject(func(p *roce.Packet) {
			p.Opcode, p.PSN, p.Imm = roce.SendOnlyInv, 0x1234, r.mr.RKey()
			p.Payload = append(p.Payload[:0], "8 bytes!"...)
		})
		invalid(t, r)
	})
	t.Run("EmptyLast", func(t *testing.T) {
		r := newRig(t)
		if err := r.qp.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{r.mr.SGE(0, 4096)}}); err != nil {
			t.Fatal(err)
		}
		r.inject(carrying(roce.SendFirst, 0x1234, bytes.Repeat([]byte{'F'}, 1024)))
		r.inject(carrying(roce.SendLast, 0x1235, nil))
		invalid(t, r)
	})
}

// TestReservedAETH: an acknowledgement of the reserved AETH kind is
// counted as an error; it was dropped unseen.
func TestReservedAETH(t *testing.T) {
	r := newRig(t)
	if err := r.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{r.mr.SGE(0, 8)}}); err != nil {
		t.Fatal(err)
	}
	r.sink.collect(t, 1)
	r.inject(func(p *roce.Packet) { p.Opcode, p.PSN, p.Syndrome = roce.Acknowledge, 0x1234, 0x40 })
	waitFor(t, "receive error", func() bool { return r.d.counters.RcvErrors.Load() == 1 })
	r.inject(func(p *roce.Packet) { p.Opcode, p.PSN, p.Syndrome = roce.Acknowledge, 0x1234, roce.AETHAck })
	r.wantWC(t, 1, verbs.WCSuccess)
}

// TestRNRRetryZero: with rnr_retry 0 the first RNR NAK ends the request
// with RNR_RETRY_EXC_ERR, counted in req_rnr_retries_exceeded (not in
// rnr_nak_retry_err, the RNR NAKs retried), and nothing is sent again.
func TestRNRRetryZero(t *testing.T) {
	r := newRig(t)
	r.noTimer(0)
	if err := r.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{r.mr.SGE(0, 8)}}); err != nil {
		t.Fatal(err)
	}
	r.sink.collect(t, 1)
	r.inject(func(p *roce.Packet) { p.Opcode, p.PSN, p.Syndrome = roce.Acknowledge, 0x1234, roce.AETHRNRNak|1 })
	r.wantWC(t, 1, verbs.WCRNRRetryExcErr)
	c := &r.d.counters
	if c.RNRNaksReceived.Load() != 1 || counter(c, "req_rnr_retries_exceeded") != 1 || c.RNRNakRetryErr.Load() != 0 ||
		c.Retransmits.Load() != 0 {
		t.Errorf("RNR NAKs %d, req_rnr_retries_exceeded %d, rnr_nak_retry_err %d, retransmissions %d; want 1, 1, 0, 0",
			c.RNRNaksReceived.Load(), counter(c, "req_rnr_retries_exceeded"), c.RNRNakRetryErr.Load(), c.Retransmits.Load())
	}
	if got := r.sink.drain(); len(got) != 0 {
		t.Errorf("%d packets sent after the RNR NAK", len(got))
	}
}
