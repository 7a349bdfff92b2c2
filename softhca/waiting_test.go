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

// Responses go in PSN order, so an acknowledgement or a NAK that comes due
// while a READ's responses stream waits for them (responder.go: sendAck,
// nak). Some of these tests catch the responder between two rounds of four
// 1 MiB READs at MTU 256 (16,384 responses, 64 a round), holding the device
// mutex; those that must find a NAK waiting hold the READs' responses back
// instead (heldReads), as a window of rounds can be missed on a loaded
// machine, and the acknowledgement they wait for would follow the whole
// stream.

// readPSN is the rig's first PSN, that of the first READ; the next
// request's PSN comes after the READs' responses.
const (
	readPSN  = 0x1234
	readPkts = 4 * 4096
	nextPSN  = readPSN + readPkts
)

// lockedWhen waits until cond holds under the device mutex and returns with
// the mutex held.
func (r *rig) lockedWhen(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		r.d.mu.Lock()
		if cond() {
			return
		}
		r.d.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 10 seconds", what)
		}
		time.Sleep(10 * time.Microsecond)
	}
}

// readRequests sends the four READs.
func (r *rig) readRequests() { r.readRequestsOf(1 << 20) }

// readRequestsOf sends four READs of n bytes each (a multiple of the MTU,
// 256), from readPSN.
func (r *rig) readRequestsOf(n uint32) {
	for i := range uint32(4) {
		r.inject(func(p *roce.Packet) {
			p.Opcode, p.PSN, p.VA, p.RKey, p.DMALen = roce.ReadRequest, readPSN+i*n/256, r.mr.Addr(), r.mr.RKey(), n
		})
	}
}

// heldReads sends four READs of 16 KiB (64 responses each, a round's
// worth, 256 in all) whose responses the engine holds back
// (engine.holdReads) until letReadsGo, and returns the PSN of the request
// after them: what comes due behind the READs waits, however long the test
// takes to look, and goes a few rounds after it lets them go.
func (r *rig) heldReads() uint32 {
	r.d.mu.Lock()
	r.d.eng.holdReads = true
	r.d.mu.Unlock()
	r.readRequestsOf(16 << 10)
	return readPSN + 4*64
}

// letReadsGo lets the engine send the READ responses it holds. Caller
// holds d.mu.
func (r *rig) letReadsGo() {
	r.d.eng.holdReads = false
	r.d.eng.kick()
}

// untilAck collects what comes to the sink up to the first acknowledgement
// (an ACK, not a NAK), and what comes with it.
func (r *rig) untilAck(t *testing.T) []*roce.Packet {
	t.Helper()
	var got []*roce.Packet
	waitFor(t, "acknowledgement", func() bool {
		got = append(got, r.sink.drain()...)
		for _, p := range got {
			if p.Opcode.Op() == roce.Acknowledge && p.Syndrome&roce.AETHKind == roce.AETHAck {
				return true
			}
		}
		return false
	})
	time.Sleep(10 * time.Millisecond) // the rest of the flush it came in
	return append(got, r.sink.drain()...)
}

// A NAK waiting behind a READ's responses is dropped when the packet it
// NAKs comes (the requester went back) before the NAK went out: sent
// later, it would send the requester back for a request done already, and
// with no retries left fail it. An RNR NAK of a SEND that found no
// receive, and a sequence NAK of a lost WRITE.
func TestWaitingNAKDroppedOnceAnswered(t *testing.T) {
	for _, rnr := range []bool{true, false} {
		t.Run(map[bool]string{true: "RNR", false: "sequence"}[rnr], func(t *testing.T) {
			r := newRigWith(t, verbstest.Options{MTU: verbs.MTU256})
			q := r.d.qps.get(r.qp.Num())
			next := r.heldReads()
			send := func(p *roce.Packet) {
				p.Opcode, p.PSN, p.AckReq = roce.SendOnly, next, true
				p.Payload = append(p.Payload[:0], "8 bytes!"...)
			}
			write := func(psn uint32) func(p *roce.Packet) {
				return func(p *roce.Packet) {
					p.Opcode, p.PSN, p.VA, p.RKey, p.DMALen, p.AckReq = roce.WriteOnly, psn, r.mr.Addr(), r.mr.RKey(), 8, true
					p.Payload = append(p.Payload[:0], "12345678"...)
				}
			}
			if rnr {
				r.inject(send) // no receive posted
			} else {
				r.inject(write(next + 1)) // the WRITE at next was lost
			}
			r.lockedWhen(t, "NAK waiting for the READs", func() bool { return q.resp.nakAfterReads })
			if len(q.resp.reads) == 0 {
				t.Fatal("a NAK waits with no READ responses left to send")
			}
			// The requester goes back: the NAKed packet comes again.
			done := next + 1 // the expected PSN once it is taken
			if rnr {
				if err := r.qp.PostRecv(&verbs.RecvWR{WRID: 7, SG: []verbs.SGE{r.mr.SGE(0, 64)}}); err != nil {
					t.Fatal(err)
				}
				r.inject(send)
			} else {
				r.inject(write(next))
				r.inject(write(next + 1))
				done++
			}
			r.d.mu.Unlock()
			// The READ responses go once the engine has taken the
			// packets sent again (it may hold a batch it took before
			// the lock, without them): let go before, the round that
			// sends the last responses could send the NAK with them,
			// ahead of the packets, as on a network, and rightly so.
			r.lockedWhen(t, "the packets sent again taken", func() bool { return q.resp.epsn == done })
			r.letReadsGo()
			r.d.mu.Unlock()
			got := r.untilAck(t)
			for _, p := range got {
				if p.Opcode.Op() == roce.Acknowledge && p.Syndrome&roce.AETHKind != roce.AETHAck {
					t.Errorf("NAK (syndrome %#x) for PSN %#x sent after the packet it NAKs was done", p.Syndrome, p.PSN)
				}
			}
			if rnr {
				if wc := pollWait(t, r.cq); wc.Status != verbs.WCSuccess || wc.WRID != 7 {
					t.Fatalf("receive completion %+v", wc)
				}
			}
		})
	}
}

// A QP moved to the error state from outside while a READ's responses
// stream stops sending them, and sends neither the acknowledgement nor the
// NAK that waited for them.
func TestErrorStateStopsResponses(t *testing.T) {
	r := newRigWith(t, verbstest.Options{MTU: verbs.MTU256})
	q := r.d.qps.get(r.qp.Num())
	next := r.heldReads()
	r.inject(func(p *roce.Packet) { // finds no receive: an RNR NAK waits
		p.Opcode, p.PSN, p.AckReq = roce.SendOnly, next, true
		p.Payload = append(p.Payload[:0], "8 bytes!"...)
	})
	r.lockedWhen(t, "NAK waiting for the READs", func() bool { return q.resp.nakAfterReads })
	r.d.setState(q, qpstate.Err) // as a modify to ERR does
	sent := r.d.counters.XmitPackets.Load()
	r.sink.drain()
	r.letReadsGo()
	r.d.mu.Unlock()
	r.lockedWhen(t, "READ responses dropped", func() bool { return !q.resp.queued })
	r.d.mu.Unlock()
	if n := r.d.counters.XmitPackets.Load() - sent; n != 0 {
		t.Errorf("%d packets sent in the error state", n)
	}
	for _, p := range r.sink.drain() {
		t.Errorf("%v for PSN %#x sent in the error state", p.Opcode, p.PSN)
	}
}

// lastAcks returns the Acknowledge packets among ps, in order.
func lastAcks(ps []*roce.Packet) []*roce.Packet {
	var out []*roce.Packet
	for _, p := range ps {
		if p.Opcode.Op() == roce.Acknowledge {
			out = append(out, p)
		}
	}
	return out
}

// When the packet a waiting NAK asks for comes late (the network held it
// back, or delivered a copy), not sent again, the packets dropped after
// it in the meantime are still missing: the NAK is renewed for the first
// of them, after the acknowledgement of the late one, so that the
// requester goes back now instead of at its timeout.
func TestWaitingNAKRenewedForDroppedPackets(t *testing.T) {
	for _, rnr := range []bool{false, true} {
		t.Run(map[bool]string{false: "late original", true: "copy after RNR"}[rnr], func(t *testing.T) {
			r := newRigWith(t, verbstest.Options{MTU: verbs.MTU256})
			q := r.d.qps.get(r.qp.Num())
			next := r.heldReads()
			write := func(psn uint32) func(p *roce.Packet) {
				return func(p *roce.Packet) {
					p.Opcode, p.PSN, p.VA, p.RKey, p.DMALen, p.AckReq = roce.WriteOnly, psn, r.mr.Addr(), r.mr.RKey(), 8, true
					p.Payload = append(p.Payload[:0], "12345678"...)
				}
			}
			send := func(p *roce.Packet) {
				p.Opcode, p.PSN, p.AckReq = roce.SendOnly, next, true
				p.Payload = append(p.Payload[:0], "8 bytes!"...)
			}
			if rnr {
				r.inject(send) // no receive: an RNR NAK waits
			} else {
				r.inject(write(next + 1)) // before next: a sequence NAK waits
			}
			r.inject(write(next + 2)) // dropped under the NAK
			r.lockedWhen(t, "NAK waiting for the READs, a packet dropped", func() bool { return q.resp.nakAfterReads && q.resp.nakDropped })
			if rnr {
				if err := r.qp.PostRecv(&verbs.RecvWR{WRID: 7, SG: []verbs.SGE{r.mr.SGE(0, 64)}}); err != nil {
					t.Fatal(err)
				}
				r.inject(send) // the network's copy
			} else {
				r.inject(write(next)) // the late original
			}
			r.d.mu.Unlock()
			r.lockedWhen(t, "the late packet taken", func() bool { return q.resp.epsn == next+1 })
			r.letReadsGo()
			r.d.mu.Unlock()
			acks := lastAcks(r.untilAck(t))
			want := []struct {
				psn  uint32
				kind uint8
			}{{next, roce.AETHAck}, {next + 1, roce.AETHNak}}
			if len(acks) != len(want) {
				t.Fatalf("%d acknowledgements and NAKs, want an ACK of %#x and a sequence NAK of %#x", len(acks), next, next+1)
			}
			for i, w := range want {
				if a := acks[i]; a.PSN != w.psn || a.Syndrome&roce.AETHKind != w.kind {
					t.Errorf("acknowledgement %d: PSN %#x syndrome %#x, want PSN %#x kind %#x", i, a.PSN, a.Syndrome, w.psn, w.kind)
				}
			}
		})
	}
}

// A fatal NAK behind READs that stream over many rounds follows all of
// their responses.
func TestFatalNAKAfterLongRead(t *testing.T) {
	r := newRigWith(t, verbstest.Options{MTU: verbs.MTU256})
	q := r.d.qps.get(r.qp.Num())
	r.readRequests()
	r.lockedWhen(t, "READs streaming", func() bool { return len(q.resp.reads) > 0 })
	r.inject(func(p *roce.Packet) { // a bad key: fatal
		p.Opcode, p.PSN, p.VA, p.RKey, p.DMALen = roce.WriteOnly, nextPSN, 0x1000, 0x77, 8
		p.Payload = append(p.Payload[:0], "12345678"...)
	})
	r.d.mu.Unlock()
	got := r.sink.collect(t, readPkts+1)
	time.Sleep(20 * time.Millisecond)
	got = append(got, r.sink.drain()...)
	last := got[len(got)-1]
	if len(got) != readPkts+1 || last.Opcode.Op() != roce.Acknowledge || last.Syndrome != roce.AETHNak|roce.NakRemoteAccess {
		t.Errorf("%d packets, the last %v PSN %#x syndrome %#x; want the %d READ responses, then the fatal NAK",
			len(got), last.Opcode, last.PSN, last.Syndrome, readPkts)
	}
}

// A QP reset while READ responses stream, and brought back, stays listed
// once in the engine's READ queue when new READs come (listed twice, it
// would send twice its share a round).
func TestResetQPListedOnce(t *testing.T) {
	r := newRigWith(t, verbstest.Options{MTU: verbs.MTU256})
	q := r.d.qps.get(r.qp.Num())
	r.readRequests()
	r.lockedWhen(t, "READs streaming", func() bool { return len(q.resp.reads) > 0 })
	for _, st := range []qpstate.State{qpstate.Reset, qpstate.Init, qpstate.RTR, qpstate.RTS} {
		r.d.setState(q, st) // as modifies do, with the attributes the QP has
	}
	// The READs again, from the first PSN: as many responses as before,
	// so that a slow machine catches these mid-stream too.
	r.readRequests()
	r.d.mu.Unlock()
	r.lockedWhen(t, "the new READs streaming", func() bool { return len(q.resp.reads) > 0 })
	n := 0
	for _, x := range r.d.eng.readq {
		if x == q {
			n++
		}
	}
	r.d.mu.Unlock()
	if n != 1 {
		t.Errorf("the QP is listed %d times in the READ queue", n)
	}
}
