package roce

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/netip"
	"os"
	"testing"
)

// capture is one RoCEv2 packet of a pcap file, split at its layers.
type capture struct {
	ip, udp, transport []byte // transport without the ICRC
	icrc               uint32
}

// readCaptures reads an Ethernet pcap file and returns its UDP port 4791
// packets.
func readCaptures(t testing.TB, path string) []capture {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Skipf("capture not available: %v", err)
	}
	if len(b) < 24 || binary.LittleEndian.Uint32(b) != 0xa1b2c3d4 || binary.LittleEndian.Uint32(b[20:]) != 1 {
		t.Fatalf("%s: not a little-endian Ethernet pcap", path)
	}
	var out []capture
	for off := 24; off+16 <= len(b); {
		incl := int(binary.LittleEndian.Uint32(b[off+8:]))
		frame := b[off+16 : off+16+incl]
		off += 16 + incl
		eth := 14
		etype := binary.BigEndian.Uint16(frame[12:])
		if etype == 0x8100 {
			eth, etype = 18, binary.BigEndian.Uint16(frame[16:])
		}
		var ip []byte
		switch etype {
		case 0x0800:
			ip = frame[eth : eth+int(frame[eth]&0xf)*4]
			if ip[9] != 17 {
				continue
			}
		case 0x86dd:
			ip = frame[eth : eth+40]
			if ip[6] != 17 {
				continue
			}
		default:
			continue
		}
		udp := frame[eth+len(ip) : eth+len(ip)+8]
		if binary.BigEndian.Uint16(udp[2:]) != UDPPort {
			continue
		}
		end := eth + len(ip) + int(binary.BigEndian.Uint16(udp[4:]))
		payload := frame[eth+len(ip)+8 : end]
		out = append(out, capture{ip: ip, udp: udp, transport: payload[:len(payload)-ICRCLen],
			icrc: binary.LittleEndian.Uint32(payload[len(payload)-ICRCLen:])})
	}
	return out
}

const rxeCapture = "../../../shared/testdata/rxe-roce-linux6.1.pcap"

// TestRxeCapture decodes every packet Linux's Soft-RoCE sent, verifies its
// ICRC, and encodes it back to the same bytes.
func TestRxeCapture(t *testing.T) {
	caps := readCaptures(t, rxeCapture)
	if len(caps) < 100 {
		t.Fatalf("only %d RoCEv2 packets in the capture", len(caps))
	}
	seen := map[Opcode]int{}
	v6 := 0
	for i, c := range caps {
		var p Packet
		if err := ParseTransport(c.transport, &p); err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
		seen[p.Opcode]++
		if c.ip[0]>>4 == 6 {
			v6++
		}
		if got := ICRC(c.ip, c.udp, c.transport); got != c.icrc {
			t.Fatalf("packet %d (%v): ICRC %08x, captured %08x", i, p.Opcode, got, c.icrc)
		}
		// The same from headers, payload and pad held apart.
		h := len(c.transport) - len(p.Payload) - int(p.Pad)
		tr := c.transport
		if got := new(ICRCScratch).ICRC(c.ip, c.udp, tr[:h], tr[h:h+len(p.Payload)], tr[h+len(p.Payload):]); got != c.icrc {
			t.Fatalf("packet %d (%v): ICRC in parts %08x, captured %08x", i, p.Opcode, got, c.icrc)
		}
		if out := p.AppendTransport(nil); !bytes.Equal(out, c.transport) {
			t.Fatalf("packet %d (%v): re-encoded\n%x\ncaptured\n%x", i, p.Opcode, out, c.transport)
		}
		if p.Len() != len(c.transport)+ICRCLen {
			t.Fatalf("packet %d: Len %d, captured %d", i, p.Len(), len(c.transport)+ICRCLen)
		}
	}
	for _, o := range []Opcode{SendFirst, SendMiddle, SendLast, SendOnly, WriteFirst, WriteLast, ReadRequest,
		ReadResponseFirst, ReadResponseLast, Acknowledge, AtomicAcknowledge, CompareSwap, FetchAdd} {
		if seen[o] == 0 {
			t.Errorf("no RC %v packet in the capture", o)
		}
	}
	if v6 == 0 {
		t.Error("no IPv6 packet in the capture")
	}
	t.Logf("%d packets, %d over IPv6: %v", len(caps), v6, fmt.Sprint(seen))
}

// TestPseudoHeaders checks that the headers a receiver rebuilds give the
// ICRC the sender computed: exactly the captured one over IPv6, and over
// IPv4 the one of the captured header with its identification zeroed.
func TestPseudoHeaders(t *testing.T) {
	var buf [48]byte
	for i, c := range readCaptures(t, rxeCapture) {
		src, dst, ip := c.ip[12:16], c.ip[16:20], append([]byte(nil), c.ip...)
		if c.ip[0]>>4 == 6 {
			src, dst = c.ip[8:24], c.ip[24:40]
		} else {
			ip[4], ip[5] = 0, 0
		}
		sa, _ := netipFrom(src)
		da, _ := netipFrom(dst)
		pip, pudp := PseudoHeaders(buf[:], sa, da, binary.BigEndian.Uint16(c.udp), len(c.transport))
		want := ICRC(ip, c.udp, c.transport)
		if got := ICRC(pip, pudp, c.transport); got != want {
			t.Fatalf("packet %d: pseudo-header ICRC %08x, want %08x", i, got, want)
		}
		if c.ip[0]>>4 == 6 && want != c.icrc {
			t.Fatalf("packet %d: IPv6 ICRC differs from the capture", i)
		}
	}
}

func FuzzParseTransport(f *testing.F) {
	for _, c := range readCaptures(f, rxeCapture) {
		f.Add(c.transport)
	}
	f.Add([]byte{})
	f.Add(make([]byte, BTHLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		if err := ParseTransport(b, &p); err != nil {
			return
		}
		// What decodes encodes back to the same bytes, but for the pad.
		out := p.AppendTransport(nil)
		if len(out) != len(b) || !bytes.Equal(out[:len(out)-int(p.Pad)], b[:len(b)-int(p.Pad)]) {
			t.Fatalf("decoded %+v from\n%x\nencodes to\n%x", p, b, out)
		}
		var q Packet
		if err := ParseTransport(out, &q); err != nil || q.Opcode != p.Opcode || q.PSN != p.PSN || !bytes.Equal(q.Payload, p.Payload) {
			t.Fatalf("re-decoding: %+v, %v", q, err)
		}
	})
}

func netipFrom(b []byte) (netip.Addr, bool) { return netip.AddrFromSlice(b) }

// TestICRCPieces checks the ICRC of transport parts of every length up to
// a few hundred bytes, and of full 4 KiB packets, cut into headers,
// payload and tail at every kind of place, over IPv4 and IPv6, against
// the CRC-32 of the masked packet in one piece.
func TestICRCPieces(t *testing.T) {
	var hbuf [48]byte
	var s ICRCScratch
	for _, pair := range [][2]string{{"10.0.0.1", "10.0.0.2"}, {"fd00::1", "fd00::2"}} {
		src, dst := netip.MustParseAddr(pair[0]), netip.MustParseAddr(pair[1])
		lengths := []int{BTHLen + 4096, BTHLen + 16 + 4096, BTHLen + 4 + 4096}
		for n := BTHLen; n < BTHLen+300; n++ {
			lengths = append(lengths, n)
		}
		for _, n := range lengths {
			tr := make([]byte, n)
			for i := range tr {
				tr[i] = byte(i*131 + n)
			}
			ip, udp := PseudoHeaders(hbuf[:], src, dst, 49152, n)
			masked := append(bytes.Clone(maskedLRH[:]), ip...)
			if src.Is4() {
				masked[8+1], masked[8+8], masked[8+10], masked[8+11] = 0xff, 0xff, 0xff, 0xff
			} else {
				masked[8] |= 0x0f
				masked[8+1], masked[8+2], masked[8+3], masked[8+7] = 0xff, 0xff, 0xff, 0xff
			}
			masked = append(masked, udp[:6]...)
			masked = append(masked, 0xff, 0xff)
			masked = append(masked, tr...)
			masked[len(masked)-n+4] = 0xff
			want := crc32.ChecksumIEEE(masked)
			for _, cut := range [][2]int{{BTHLen, n}, {BTHLen, BTHLen}, {min(BTHLen+16, n), n}, {BTHLen + (n-BTHLen)/3, n - (n-BTHLen)/5}, {n, n}} {
				if got := s.ICRC(ip, udp, tr[:cut[0]], tr[cut[0]:cut[1]], tr[cut[1]:]); got != want {
					t.Fatalf("%v, %d bytes cut at %v: %08x, want %08x", src, n, cut, got, want)
				}
			}
			if got := ICRC(ip, udp, tr); got != want {
				t.Fatalf("%v, %d bytes in one piece: %08x, want %08x", src, n, got, want)
			}
		}
	}
}

// TestPayloadWhereNone: a packet whose opcode carries no payload (a READ
// request, an atomic, an ACK) with bytes after its headers is malformed.
// They were taken, the bytes ignored.
func TestPayloadWhereNone(t *testing.T) {
	for _, op := range []Opcode{ReadRequest, FetchAdd, CompareSwap, Acknowledge, AtomicAcknowledge} {
		p := Packet{Opcode: op, PSN: 7, PKey: 0xffff}
		b := p.AppendTransport(nil)
		var q Packet
		if err := ParseTransport(b, &q); err != nil {
			t.Fatalf("%v: %v", op, err)
		}
		if err := ParseTransport(append(b, 1, 2, 3, 4), &q); !errors.Is(err, ErrPayload) {
			t.Errorf("%v with 4 bytes of payload: %v", op, err)
		}
	}
}
