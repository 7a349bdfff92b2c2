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
// nak). These tests catch the responder between two rounds of a 1 MiB READ
// at MTU 256 (4,096 responses, 64 a round), holding the device mutex.

// readPSN is the rig's first PSN, that of the READ; the next request's
// PSN comes after the READ's responses.
const (
	readPSN  = 0x1234
	readPkts = 4096
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

func (r *rig) readRequest(p *roce.Packet) {
	p.Opcode, p.PSN, p.VA, p.RKey, p.DMALen = roce.ReadRequest, readPSN, r.mr.Addr(), r.mr.RKey(), readPkts*256
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
			send := func(p *roce.Packet) {
				p.Opcode, p.PSN, p.AckReq = roce.SendOnly, nextPSN, true
				p.Payload = append(p.Payload[:0], "8 bytes!"...)
			}
			write := func(psn uint32) func(p *roce.Packet) {
				return func(p *roce.Packet) {
					p.Opcode, p.PSN, p.VA, p.RKey, p.DMALen, p.AckReq = roce.WriteOnly, psn, r.mr.Addr(), r.mr.RKey(), 8, true
					p.Payload = append(p.Payload[:0], "12345678"...)
				}
			}
			r.inject(r.readRequest)
			if rnr {
				r.inject(send) // no receive posted
			} else {
				r.inject(write(nextPSN + 1)) // the WRITE at nextPSN was lost
			}
			r.lockedWhen(t, "NAK waiting for the READ", func() bool { return q.resp.nakAfterReads })
			if len(q.resp.reads) == 0 {
				t.Fatal("a NAK waits with no READ responses left to send")
			}
			// The requester goes back: the NAKed packet comes again.
			if rnr {
				if err := r.qp.PostRecv(&verbs.RecvWR{WRID: 7, SG: []verbs.SGE{r.mr.SGE(0, 64)}}); err != nil {
					t.Fatal(err)
				}
				r.inject(send)
			} else {
				r.inject(write(nextPSN))
				r.inject(write(nextPSN + 1))
			}
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
	r.inject(r.readRequest)
	r.inject(func(p *roce.Packet) { // finds no receive: an RNR NAK waits
		p.Opcode, p.PSN, p.AckReq = roce.SendOnly, nextPSN, true
		p.Payload = append(p.Payload[:0], "8 bytes!"...)
	})
	r.lockedWhen(t, "NAK waiting for the READ", func() bool { return q.resp.nakAfterReads })
	r.d.setState(q, qpstate.Err) // as a modify to ERR does
	sent := r.d.counters.XmitPackets.Load()
	r.sink.drain()
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
