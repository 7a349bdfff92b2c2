//go:build linux

package softhca

import (
	"bytes"
	"testing"

	"github.com/xrcrun/xrc/softhca/roce"
	"github.com/xrcrun/xrc/verbs"
)

// TestNakAETHInResponse: a READ response or an atomic acknowledge whose
// AETH is not an ACK (a responder NAKs with an Acknowledge packet, never
// with a response: rxe_comp.c's check_ack fails the request) is a bad
// response: the request fails and takes nothing from it. Before, the
// syndrome was not looked at and the request completed successfully.
func TestNakAETHInResponse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		atomic bool
		syn    uint8
	}{
		{"ReadNAK", false, roce.AETHNak | roce.NakRemoteAccess},
		{"ReadRNRNAK", false, roce.AETHRNRNak | 1},
		{"AtomicNAK", true, roce.AETHNak | roce.NakInvalidRequest},
		{"AtomicReserved", true, 0x40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			r.noTimer(7)
			wr := &verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
				SG: []verbs.SGE{r.mr.SGE(0, 16)}, RemoteAddr: 0x1000, RKey: 0x77}
			if tc.atomic {
				wr.Opcode, wr.SG[0], wr.CompareAdd = verbs.WRAtomicFetchAdd, r.mr.SGE(64, 8), 1
			}
			if err := r.qp.PostSend(wr); err != nil {
				t.Fatal(err)
			}
			r.sink.collect(t, 1)
			if tc.atomic {
				r.inject(func(p *roce.Packet) {
					atomicAck(0x1234, 42)(p)
					p.Syndrome = tc.syn
				})
			} else {
				r.inject(func(p *roce.Packet) {
					carrying(roce.ReadResponseOnly, 0x1234, bytes.Repeat([]byte{'G'}, 16))(p)
					p.Syndrome = tc.syn
				})
			}
			r.wantWC(t, 1, verbs.WCBadRespErr)
			if bytes.Contains(r.buf[:16], []byte{'G'}) || r.buf[64] == 42 {
				t.Errorf("the response's data was taken: %q, %d", r.buf[:16], r.buf[64])
			}
		})
	}
}
