package softhca

import (
	"bytes"
	"net/netip"
	"testing"
	"unsafe"

	"github.com/xrcrun/xrc/softhca/roce"
)

// TestEncodeInPlace checks that a packet whose payload sits in its storage
// is encoded in place into the same bytes as one whose payload is elsewhere
// (sent from where it is, between headers and pad in l.wbuf), and that the
// device on the other end accepts the datagram.
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
			l.wbuf, l.iov = l.wbuf[:0], l.iov[:0]
			size := l.encode(p, dst)
			if len(l.wbuf) != 0 || len(l.iov) != 1 || len(l.iov[0]) != size || size != p.Len() {
				t.Fatalf("%v/%d: not encoded in place: %d buffers, %d bytes aside, length %d of %d",
					op, n, len(l.iov), len(l.wbuf), size, p.Len())
			}
			inPlace := bytes.Clone(l.iov[0])
			// The same packet with its payload elsewhere: the payload
			// is sent from there, between headers and pad.
			q := *p
			q.Storage = nil
			q.Payload = bytes.Clone(p.Payload)
			l.iov = l.iov[:0]
			size = l.encode(&q, dst)
			if len(l.iov) != 3 || unsafe.SliceData(l.iov[1]) != unsafe.SliceData(q.Payload) && n > 0 {
				t.Fatalf("%v/%d: payload not sent from where it is", op, n)
			}
			if gathered := bytes.Join(l.iov, nil); size != len(gathered) || !bytes.Equal(inPlace, gathered) {
				t.Fatalf("%v/%d: in place % x\ngathered (%d) % x", op, n, inPlace, size, gathered)
			}
			got := receiver.parseDatagram(inPlace, netip.AddrPortFrom(src, l.txPort), new(datagramScratch), nil)
			if got == nil {
				t.Fatalf("%v/%d: receiver rejected the datagram", op, n)
			}
			if got.Opcode != op || got.PSN != p.PSN || !bytes.Equal(got.Payload, p.Payload) {
				t.Fatalf("%v/%d: decoded %+v", op, n, got)
			}
		}
	}
}
