//go:build linux

package unix

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// RecvBatch takes every datagram waiting in one call, says where each came
// from, flags one cut short by its buffer, and fails with EAGAIN once the
// socket is empty.
func TestRecvBatch(t *testing.T) {
	rx, port := loopbackSocket(t)
	to := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	tx, txPort := loopbackSocket(t)
	// Sizes differ, so that GRO cannot merge them.
	sent := [][]byte{bytes.Repeat([]byte{1}, 100), bytes.Repeat([]byte{2}, 300), bytes.Repeat([]byte{3}, 5000)}
	s := NewUDPSender(tx)
	before := time.Now().UnixNano()
	for _, d := range sent {
		if err := s.SendVec([][]byte{d}, 0, to); err != nil {
			t.Fatal(err)
		}
	}
	r := NewUDPReceiver(rx)
	bufs := [][]byte{make([]byte, 1024), make([]byte, 1024), make([]byte, 1024), make([]byte, 1024)}
	ds := make([]Datagram, len(bufs))
	n, err := r.RecvBatch(bufs, ds)
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now().UnixNano()
	if n != len(sent) {
		t.Fatalf("received %d datagrams in one call, sent %d", n, len(sent))
	}
	for i, d := range ds[:n] {
		if d.From.Port() != txPort || !d.From.Addr().Is4() {
			t.Errorf("datagram %d from %v, sent from port %d", i, d.From, txPort)
		}
		if d.Seg != 0 {
			t.Errorf("datagram %d: GRO segment size %d for a single datagram", i, d.Seg)
		}
		// The wall clock may step meanwhile; a second's slack keeps the
		// check from failing on that, not on a missing or garbled stamp.
		if d.Stamp < before-1e9 || d.Stamp > after+1e9 {
			t.Errorf("datagram %d: received at %d, sent after %d and read by %d", i, d.Stamp, before, after)
		}
	}
	for i, d := range ds[:2] {
		if d.Trunc || d.N != len(sent[i]) || !bytes.Equal(bufs[i][:d.N], sent[i]) {
			t.Errorf("datagram %d: %+v, want the %d bytes sent", i, d, len(sent[i]))
		}
	}
	if !ds[2].Trunc {
		t.Errorf("a 5000-byte datagram in a 1024-byte buffer: %+v, want it flagged as cut short", ds[2])
	}
	if _, err := r.RecvBatch(bufs, ds); !errors.Is(err, EAGAIN) {
		t.Fatalf("receive on an empty socket: %v, want EAGAIN", err)
	}
}

// loopbackSocket opens a UDP socket on 127.0.0.1, a free port, which the
// test closes at its end.
func loopbackSocket(t *testing.T) (int, uint16) {
	t.Helper()
	fd, err := UDPSocket(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	port, err := LocalPort(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fd, port
}

// A RoCEv2 socket over IPv6 takes datagrams whose UDP checksum is 0, as
// RoCEv2 senders leave it (the ICRC covers the packet; Linux's Soft-RoCE
// does, as the capture in the shared test data shows; RFC 6935 allows it
// for tunnels). Linux drops them unless the socket asks for them.
func TestZeroChecksumIPv6(t *testing.T) {
	rx, err := UDPSocket(netip.MustParseAddrPort("[::1]:0"))
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	t.Cleanup(func() { unix.Close(rx) })
	if err := TuneRoCESocket(rx, false, 1<<20); err != nil {
		t.Fatal(err)
	}
	port, err := LocalPort(rx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := UDPSocket(netip.MustParseAddrPort("[::1]:0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(tx) })
	if err := unix.SetsockoptInt(tx, unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_TX, 1); err != nil {
		t.Fatal(err)
	}
	sent := bytes.Repeat([]byte{6}, 64)
	if err := NewUDPSender(tx).SendVec([][]byte{sent}, 0, netip.AddrPortFrom(netip.IPv6Loopback(), port)); err != nil {
		t.Fatal(err)
	}
	if !ReadableWithin(rx, 10*time.Second) {
		t.Fatal("a datagram with a zero UDP checksum over IPv6 was dropped")
	}
	bufs, ds := [][]byte{make([]byte, 1024)}, make([]Datagram, 1)
	if n, err := NewUDPReceiver(rx).RecvBatch(bufs, ds); err != nil || n != 1 || !bytes.Equal(bufs[0][:ds[0].N], sent) {
		t.Fatalf("received %d datagrams (%v): %+v", n, err, ds[0])
	}
}
