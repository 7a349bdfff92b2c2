//go:build linux

package softhca

import (
	"bytes"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca/roce"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// A response to a READ or an atomic that completed already (the responder
// answers a copy of the request) is no error and lands nowhere, and it
// starts the transport timer over: the acknowledgement of the SEND after
// the READ comes after the copy's responses, and a copy of a long READ
// must not run the SEND's timer out.
func TestAnsweredAgain(t *testing.T) {
	for _, atomic := range []bool{false, true} {
		t.Run(map[bool]string{false: "READ", true: "atomic"}[atomic], func(t *testing.T) {
			// A transport timeout of about a second (18), so that a slow
			// machine does not see the SEND's timer run out by itself.
			r := newRigWith(t, verbstest.Options{Timeout: 18})
			q := r.d.qps.get(r.qp.Num())
			first := &verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
				SG: []verbs.SGE{r.mr.SGE(0, 16)}, RemoteAddr: 0x1000, RKey: 0x77}
			if atomic {
				first = &verbs.SendWR{WRID: 1, Opcode: verbs.WRAtomicFetchAdd, Flags: verbs.SendSignaled,
					SG: []verbs.SGE{r.mr.SGE(0, 8)}, RemoteAddr: 0x1000, RKey: 0x77, CompareAdd: 1}
			}
			first.Next = &verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
				SG: []verbs.SGE{r.mr.SGE(64, 8)}}
			if err := r.qp.PostSend(first); err != nil {
				t.Fatal(err)
			}
			r.sink.collect(t, 2)
			answer := func(fill byte) func(p *roce.Packet) {
				return func(p *roce.Packet) {
					p.PSN, p.Syndrome = 0x1234, roce.AETHAck
					if atomic {
						p.Opcode, p.OrigData = roce.AtomicAcknowledge, uint64(fill)
					} else {
						p.Opcode = roce.ReadResponseOnly
						p.Payload = append(p.Payload[:0], bytes.Repeat([]byte{fill}, 16)...)
					}
				}
			}
			r.inject(answer('G'))
			if wc := pollWait(t, r.cq); wc.Status != verbs.WCSuccess || wc.WRID != 1 {
				t.Fatalf("completion %+v, want the first request's", wc)
			}
			want := bytes.Clone(r.buf[:16])

			r.d.mu.Lock()
			before, errs, rcvd := q.req.timerAt, r.d.counters.RcvErrors.Load(), r.d.counters.RcvPackets.Load()
			r.d.mu.Unlock()
			if before == 0 {
				t.Fatal("no transport timer runs for the SEND")
			}
			time.Sleep(5 * time.Millisecond) // the engine's clock moves on
			r.inject(answer('H'))            // the answer to a copy
			waitFor(t, "the copy's answer taken", func() bool { return r.d.counters.RcvPackets.Load() > rcvd })
			r.d.mu.Lock()
			after := q.req.timerAt
			r.d.mu.Unlock()
			if after <= before {
				t.Errorf("transport timer at %v after the answer to a copy, %v before: want it later", after, before)
			}
			if n := r.d.counters.RcvErrors.Load() - errs; n != 0 {
				t.Errorf("the answer to a copy counted as %d receive errors", n)
			}
			if !bytes.Equal(r.buf[:16], want) {
				t.Errorf("the answer to a copy landed: %q, want %q", r.buf[:16], want)
			}
			if got := r.sink.drain(); len(got) != 0 {
				t.Errorf("%d packets sent for the answer to a copy, first %v PSN %#x", len(got), got[0].Opcode, got[0].PSN)
			}
		})
	}
}
