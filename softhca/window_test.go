//go:build linux

package softhca

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca/roce"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// A long SEND goes out as far as the send window lets it and no further,
// in runs of packets whose data is read at once (sendRequests): the first
// window, then, after an ACK, exactly the packets the ACK let go, starting
// inside a piece of memory. Every packet carries its own bytes of the
// message, gathered from three pieces out of order, with memory reached
// directly and through process_vm_readv.
func TestSendWindowRuns(t *testing.T) {
	for _, noViews := range []bool{false, true} {
		name := map[bool]string{false: "direct", true: "through-process"}[noViews]
		t.Run(name, func(t *testing.T) {
			// A transport timeout of about a minute: no retransmission
			// may add packets while the test counts them.
			r := newRigAll(t, verbstest.Options{Timeout: 24}, noViews)
			rng := rand.New(rand.NewPCG(3, 4))
			for i := range r.buf {
				r.buf[i] = byte(rng.Uint32())
			}
			sg := []verbs.SGE{r.mr.SGE(700000, 80000), r.mr.SGE(1000, 70000), r.mr.SGE(300000, 54800)}
			msg := slices.Concat(r.buf[700000:780000], r.buf[1000:71000], r.buf[300000:354800])
			const mtu, first = 1024, 0x1234 // verbstest's path MTU and first PSN
			if len(msg) != 200*mtu {
				t.Fatalf("message of %d bytes", len(msg))
			}
			if err := r.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SG: sg}); err != nil {
				t.Fatal(err)
			}
			// check takes what the sink got: exactly n packets, from
			// PSN from on, each with its bytes of the message.
			check := func(n int, from uint32) {
				t.Helper()
				got := r.sink.collect(t, n)
				time.Sleep(20 * time.Millisecond) // what else the round sent
				got = append(got, r.sink.drain()...)
				if len(got) != n {
					t.Fatalf("%d packets went out, want %d", len(got), n)
				}
				for i, p := range got {
					k := int(p.PSN - first)
					if p.PSN != from+uint32(i) || !bytes.Equal(p.Payload, msg[k*mtu:(k+1)*mtu]) {
						t.Fatalf("packet %d: PSN %#x, %d bytes; want PSN %#x with bytes [%d, %d) of the message",
							i, p.PSN, len(p.Payload), from+uint32(i), k*mtu, (k+1)*mtu)
					}
				}
			}
			check(initialWindow, first)
			// Acknowledging 10 packets widens the window by 10 (slow
			// start), so 20 more may go: PSNs up to acked+74.
			r.inject(func(p *roce.Packet) {
				p.Opcode, p.PSN, p.Syndrome = roce.Acknowledge, first+9, roce.AETHAck
			})
			check(20, first+initialWindow)
		})
	}
}
