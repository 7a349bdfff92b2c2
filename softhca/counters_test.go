//go:build linux

package softhca

import (
	"testing"

	"github.com/xrcrun/xrc/softhca/roce"
	"github.com/xrcrun/xrc/verbs"
)

// port_xmit_data and port_rcv_data count what they count on a real HCA's
// port (sysfs, after the PortCounters of IBA 16.1.3.5): the octets of the
// packets, headers and ICRC included, divided by 4; not bytes of payload.
// Over RoCEv2 the IP and UDP headers take the place of the LRH and GRH.
func TestPortDataInWords(t *testing.T) {
	r := newRig(t) // IPv4: 20 bytes of IP header, 8 of UDP
	r.noTimer(0)
	if err := r.qp.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{r.mr.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	r.inject(carrying(roce.SendOnly, 0x1234, []byte("10 bytes!!")))
	r.wantWC(t, 1, verbs.WCSuccess)
	r.sink.collect(t, 1) // the ACK
	if err := r.qp.PostSend(&verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, SG: []verbs.SGE{r.mr.SGE(0, 5)}}); err != nil {
		t.Fatal(err)
	}
	r.wantSent(t, sent{roce.SendOnly, 0x1234})
	c := r.d.Counters()
	// Received: a SEND_ONLY of 10 bytes, 2 of pad.
	if got, want := c.RcvData.Load(), uint64(20+8+roce.BTHLen+10+2+roce.ICRCLen)/4; got != want {
		t.Errorf("port_rcv_data %d, want %d", got, want)
	}
	// Sent: an ACK, and a SEND_ONLY of 5 bytes, 3 of pad.
	ack := 20 + 8 + roce.BTHLen + roce.AETHLen + roce.ICRCLen
	send := 20 + 8 + roce.BTHLen + 5 + 3 + roce.ICRCLen
	if got, want := c.XmitData.Load(), uint64(ack+send)/4; got != want {
		t.Errorf("port_xmit_data %d, want %d", got, want)
	}
	if got := c.XmitPackets.Load(); got != 2 {
		t.Errorf("port_xmit_packets %d, want 2", got)
	}
}
