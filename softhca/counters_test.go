//go:build linux

package softhca

import (
	"net/netip"
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

// A packet with a bad ICRC is a packet received with an error: it counts
// in port_rcv_errors, as the IBA's PortRcvErrors counts local physical
// errors (ICRC among them), as well as in port_rcv_icrc_errors.
func TestBadICRCIsReceiveError(t *testing.T) {
	r := newRig(t)
	p := roce.Packet{Opcode: roce.SendOnly, PSN: 0x1234, PKey: 0xffff, DestQP: r.qp.Num(), Payload: []byte("data")}
	b := append(p.AppendTransport(nil), 1, 2, 3, 4) // not its ICRC
	from := netip.AddrPortFrom(netip.AddrFrom16(r.sink.gid).Unmap(), 49152)
	var s datagramScratch
	if q := r.d.parseDatagram(b, from, &s, nil); q != nil {
		t.Fatalf("datagram with a bad ICRC taken: %v", q.Opcode)
	}
	c := r.d.Counters()
	if errs, icrc := c.RcvErrors.Load(), c.RcvICRCErrors.Load(); errs != 1 || icrc != 1 {
		t.Errorf("port_rcv_errors %d, port_rcv_icrc_errors %d; want 1 and 1", errs, icrc)
	}
}

// counter returns the value of the device counter of the given name.
func counter(c *Counters, name string) uint64 {
	var v uint64
	c.Each(func(n, _ string, x uint64) {
		if n == name {
			v = x
		}
	})
	return v
}

// rnr_nak_retry_err counts what it counts on a real HCA (mlx5's
// hw_counters): the RNR NAKs received that the requester retries after,
// its RNR retry limit not exceeded; the failure when the limit is exceeded
// is req_rnr_retries_exceeded.
func TestRNRNakRetryCounters(t *testing.T) {
	r := newRig(t)
	r.noTimer(1)
	if err := r.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{r.mr.SGE(0, 8)}}); err != nil {
		t.Fatal(err)
	}
	r.wantSent(t, sent{roce.SendOnly, 0x1234})
	rnrNak := func(p *roce.Packet) { p.Opcode, p.PSN, p.Syndrome = roce.Acknowledge, 0x1234, roce.AETHRNRNak|1 }
	r.inject(rnrNak)
	r.wantSent(t, sent{roce.SendOnly, 0x1234}) // after 10 µs
	c := r.d.Counters()
	if retried, exceeded := counter(c, "rnr_nak_retry_err"), counter(c, "req_rnr_retries_exceeded"); retried != 1 || exceeded != 0 {
		t.Errorf("after a retried RNR NAK: rnr_nak_retry_err %d, req_rnr_retries_exceeded %d; want 1 and 0", retried, exceeded)
	}
	r.inject(rnrNak)
	r.wantWC(t, 1, verbs.WCRNRRetryExcErr)
	if retried, exceeded := counter(c, "rnr_nak_retry_err"), counter(c, "req_rnr_retries_exceeded"); retried != 1 || exceeded != 1 {
		t.Errorf("after the RNR retries ran out: rnr_nak_retry_err %d, req_rnr_retries_exceeded %d; want 1 and 1", retried, exceeded)
	}
}
