//go:build linux

package softhca

import (
	"context"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca/roce"
)

// TestDelayedSendAfterClose: a packet the Delay fault holds back, whose
// timer fires after the device closed, is dropped. It was sent on the send
// socket's descriptor number, which the process may have given to another
// socket (or a TCP connection) meanwhile.
func TestDelayedSendAfterClose(t *testing.T) {
	dst := netip.MustParseAddr("127.91.0.2")
	r, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, roce.UDPPort)))
	if err != nil {
		t.Skip(err) // the address is another test's
	}
	defer r.Close()
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	d, err := New(context.Background(), Config{Name: "delayclose", Addr: netip.MustParseAddr("127.91.0.1"), UDP: true,
		Clock: clock, Faults: Faults{Delay: 1, DelayBy: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	txFD := d.link.(*udpLink).txFD
	sendAckAndClose(t, d, dst.As16())
	// Another part of the process opens sockets; one gets the number.
	reused := false
	for range 8 {
		s, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(s)
		if s == txFD {
			reused = true
			if err := syscall.Bind(s, &syscall.SockaddrInet4{Addr: [4]byte{127, 91, 0, 3}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !reused {
		t.Skip("no socket took the device's old descriptor number: nothing to show")
	}
	for clock.fire() { // the delayed packet's timer, and whatever else is armed
	}
	r.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, from, err := r.ReadFromUDPAddrPort(make([]byte, 2048)); err == nil {
		t.Fatalf("%d bytes came from %v after the device closed (its send descriptor reused: %v)", n, from, reused)
	}
}

// TestDelayedSendAfterCloseFabric: the same on a fabric, where the packet
// reached the other devices.
func TestDelayedSendAfterCloseFabric(t *testing.T) {
	f := NewFabric()
	sink := newSink(t, f, "127.92.0.2")
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	d, err := New(context.Background(), Config{Name: "delayfab", Addr: netip.MustParseAddr("127.92.0.1"), Fabric: f,
		Clock: clock, Faults: Faults{Delay: 1, DelayBy: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	sendAckAndClose(t, d, sink.gid)
	for clock.fire() {
	}
	if got := sink.drain(); len(got) != 0 {
		t.Fatalf("%d packets from the closed device reached the fabric", len(got))
	}
}

// sendAckAndClose has d send an ACK toward dst, which its Delay fault
// holds back, and then closes d.
func sendAckAndClose(t *testing.T, d *Device, dst [16]byte) {
	t.Helper()
	d.mu.Lock()
	p := getPacket()
	p.SrcGID, p.DstGID, p.DestQP, p.PKey = d.gid, dst, 1, 0xffff
	p.Opcode, p.PSN, p.Syndrome = roce.Acknowledge, 1, roce.AETHAck
	d.eng.send(p)
	d.eng.flushOut()
	d.mu.Unlock()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}
