package softhca

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/xrcrun/xrc/softhca/roce"
)

// TestEncodeInPlace checks that a packet whose payload sits in its storage
// is encoded in place into the same bytes the appending encoder gives, and
// that the device on the other end accepts the datagram.
func TestEncodeInPlace(t *testing.T) {
	src := netip.MustParseAddr("127.0.9.1")
	dst := netip.MustParseAddr("127.0.9.2")
	sender := &Device{addr: src}
	receiver := &Device{addr: dst, gid: dst.As16()}
	l := &udpLink{d: sender, txPort: 49152}
	for _, op := range []roce.Opcode{roce.SendOnly, roce.SendOnlyImm, roce.WriteFirst, roce.ReadResponseOnly, roce.Acknowledge} {
		for _, n := range []int{0, 1, 3, 4, 255, 4096} {
			if op == roce.Acknowledge && n > 0 {
				continue
			}
			p := freshPacket(nil)
			p.Opcode, p.DestQP, p.PSN, p.AckReq = op, 0x123456, 0xabcdef, true
			p.VA, p.RKey, p.DMALen, p.Imm, p.MSN = 0x1000, 7, uint32(n), 0xfeed, 9
			p.Payload = p.Storage[pktHeadroom : pktHeadroom+n]
			for i := range p.Payload {
				p.Payload[i] = byte(i * 7)
			}
			l.wbuf = l.wbuf[:0]
			inPlace := append([]byte(nil), l.encode(p, dst)...)
			if len(l.wbuf) != 0 {
				t.Fatalf("%v/%d: encoded by appending, not in place", op, n)
			}
			// The same packet with its payload elsewhere is appended.
			q := *p
			q.Storage = nil
			q.Payload = append([]byte(nil), p.Payload...)
			appended := l.encode(&q, dst)
			if !bytes.Equal(inPlace, appended) {
				t.Fatalf("%v/%d: in place % x\nappended % x", op, n, inPlace, appended)
			}
			got := receiver.parseDatagram(inPlace, netip.AddrPortFrom(src, l.txPort), new([48]byte), nil)
			if got == nil {
				t.Fatalf("%v/%d: receiver rejected the datagram", op, n)
			}
			if got.Opcode != op || got.PSN != p.PSN || !bytes.Equal(got.Payload, p.Payload) {
				t.Fatalf("%v/%d: decoded %+v", op, n, got)
			}
		}
	}
}
