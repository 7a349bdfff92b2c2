package roce

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/netip"
)

// Header lengths in bytes.
const (
	BTHLen          = 12
	XRCETHLen       = 4
	DETHLen         = 8
	RETHLen         = 16
	AETHLen         = 4
	AtomicETHLen    = 28
	AtomicAckETHLen = 8
	ImmDtLen        = 4
	IETHLen         = 4
	ICRCLen         = 4

	// UDPPort is RoCEv2's destination port.
	UDPPort = 4791
)

// Errors of packet decoding.
var (
	ErrShort   = errors.New("roce: packet too short")
	ErrOpcode  = errors.New("roce: unknown opcode")
	ErrVersion = errors.New("roce: unknown transport header version")
	ErrPad     = errors.New("roce: payload not padded to four bytes")
	ErrPayload = errors.New("roce: payload in a packet that carries none")
	ErrICRC    = errors.New("roce: ICRC mismatch")
)

// HeaderLen is the length of the transport headers an opcode carries.
func (o Opcode) HeaderLen() int {
	n := BTHLen
	if o.HasXRCETH() {
		n += XRCETHLen
	}
	if o.HasDETH() {
		n += DETHLen
	}
	if o.HasRETH() {
		n += RETHLen
	}
	if o.HasAtomicETH() {
		n += AtomicETHLen
	}
	if o.HasAETH() {
		n += AETHLen
	}
	if o.HasAtomicAckETH() {
		n += AtomicAckETHLen
	}
	if o.HasImm() {
		n += ImmDtLen
	}
	if o.HasIETH() {
		n += IETHLen
	}
	return n
}

// PadLen is how many bytes of pad follow a payload of n bytes.
func PadLen(n int) int { return (4 - n%4) % 4 }

// Len is the length of the packet's transport part with its ICRC: what a
// RoCEv2 UDP datagram carries.
func (p *Packet) Len() int {
	return p.Opcode.HeaderLen() + len(p.Payload) + PadLen(len(p.Payload)) + ICRCLen
}

// AppendTransport appends the packet's headers, payload and pad (zeros) to
// b, without the ICRC. The pad count in the BTH is derived from the payload.
func (p *Packet) AppendTransport(b []byte) []byte {
	b = p.AppendHeaders(b)
	b = append(b, p.Payload...)
	return append(b, make([]byte, PadLen(len(p.Payload)))...)
}

// AppendHeaders appends the transport headers of p (BTH and the extension
// headers of its opcode) as AppendTransport does, for a caller that places
// the payload and its pad after them itself.
func (p *Packet) AppendHeaders(b []byte) []byte {
	o := p.Opcode
	pad := PadLen(len(p.Payload))
	var bth [BTHLen]byte
	bth[0] = byte(o)
	bth[1] = byte(pad)<<4 | p.TVer&0xf
	if p.SE {
		bth[1] |= 0x80
	}
	if p.MigReq {
		bth[1] |= 0x40
	}
	binary.BigEndian.PutUint16(bth[2:], p.PKey)
	binary.BigEndian.PutUint32(bth[4:], uint32(p.Resv8a)<<24|p.DestQP&PSNMask)
	a := uint32(p.Resv7 & 0x7f)
	if p.AckReq {
		a |= 0x80
	}
	binary.BigEndian.PutUint32(bth[8:], a<<24|p.PSN&PSNMask)
	b = append(b, bth[:]...)
	if o.HasXRCETH() {
		b = binary.BigEndian.AppendUint32(b, uint32(p.XRCResv)<<24|p.XRCSRQ&PSNMask)
	}
	if o.HasDETH() {
		b = binary.BigEndian.AppendUint32(b, p.QKey)
		b = binary.BigEndian.AppendUint32(b, uint32(p.DETHResv)<<24|p.SrcQP&PSNMask)
	}
	if o.HasRETH() {
		b = binary.BigEndian.AppendUint64(b, p.VA)
		b = binary.BigEndian.AppendUint32(b, p.RKey)
		b = binary.BigEndian.AppendUint32(b, p.DMALen)
	}
	if o.HasAtomicETH() {
		b = binary.BigEndian.AppendUint64(b, p.VA)
		b = binary.BigEndian.AppendUint32(b, p.RKey)
		b = binary.BigEndian.AppendUint64(b, p.SwapAdd)
		b = binary.BigEndian.AppendUint64(b, p.Compare)
	}
	if o.HasAETH() {
		b = binary.BigEndian.AppendUint32(b, uint32(p.Syndrome)<<24|p.MSN&PSNMask)
	}
	if o.HasAtomicAckETH() {
		b = binary.BigEndian.AppendUint64(b, p.OrigData)
	}
	if o.HasImm() || o.HasIETH() {
		b = binary.BigEndian.AppendUint32(b, p.Imm)
	}
	return b
}

// ParseTransport decodes a packet's transport part (headers, payload and
// pad, without the ICRC) into p. p.Payload aliases b; p.Storage is kept.
// It validates the opcode, the header version and the lengths, and nothing
// else.
func ParseTransport(b []byte, p *Packet) error {
	if len(b) < BTHLen {
		return ErrShort
	}
	o := Opcode(b[0])
	if !o.Valid() {
		return fmt.Errorf("%w %#02x", ErrOpcode, b[0])
	}
	tver := b[1] & 0xf
	if tver != 0 {
		return fmt.Errorf("%w %d", ErrVersion, tver)
	}
	hl := o.HeaderLen()
	if len(b) < hl {
		return fmt.Errorf("%w: %d bytes for %v headers of %d", ErrShort, len(b), o, hl)
	}
	*p = Packet{
		Storage: p.Storage,
		Opcode:  o,
		SE:      b[1]&0x80 != 0,
		MigReq:  b[1]&0x40 != 0,
		Pad:     b[1] >> 4 & 3,
		PKey:    binary.BigEndian.Uint16(b[2:]),
		Resv8a:  b[4],
		DestQP:  binary.BigEndian.Uint32(b[4:]) & PSNMask,
		AckReq:  b[8]&0x80 != 0,
		Resv7:   b[8] & 0x7f,
		PSN:     binary.BigEndian.Uint32(b[8:]) & PSNMask,
	}
	off := BTHLen
	if o.HasXRCETH() {
		p.XRCSRQ = binary.BigEndian.Uint32(b[off:]) & PSNMask
		p.XRCResv = b[off]
		off += XRCETHLen
	}
	if o.HasDETH() {
		p.QKey = binary.BigEndian.Uint32(b[off:])
		p.SrcQP = binary.BigEndian.Uint32(b[off+4:]) & PSNMask
		p.DETHResv = b[off+4]
		off += DETHLen
	}
	if o.HasRETH() {
		p.VA = binary.BigEndian.Uint64(b[off:])
		p.RKey = binary.BigEndian.Uint32(b[off+8:])
		p.DMALen = binary.BigEndian.Uint32(b[off+12:])
		off += RETHLen
	}
	if o.HasAtomicETH() {
		p.VA = binary.BigEndian.Uint64(b[off:])
		p.RKey = binary.BigEndian.Uint32(b[off+8:])
		p.SwapAdd = binary.BigEndian.Uint64(b[off+12:])
		p.Compare = binary.BigEndian.Uint64(b[off+20:])
		off += AtomicETHLen
	}
	if o.HasAETH() {
		a := binary.BigEndian.Uint32(b[off:])
		p.Syndrome, p.MSN = uint8(a>>24), a&PSNMask
		off += AETHLen
	}
	if o.HasAtomicAckETH() {
		p.OrigData = binary.BigEndian.Uint64(b[off:])
		off += AtomicAckETHLen
	}
	if o.HasImm() || o.HasIETH() {
		p.Imm = binary.BigEndian.Uint32(b[off:])
		off += ImmDtLen
	}
	payload := b[off:]
	if !o.HasPayload() && (len(payload) > 0 || p.Pad != 0) {
		return fmt.Errorf("%w: %v with %d bytes", ErrPayload, o, len(payload))
	}
	if int(p.Pad) > len(payload) || len(payload)%4 != 0 {
		return fmt.Errorf("%w: %d bytes of payload with a pad of %d", ErrPad, len(payload), p.Pad)
	}
	p.Payload = payload[:len(payload)-int(p.Pad)]
	return nil
}

// The ICRC covers the packet with the fields that routers may change
// masked to ones: a masked LRH (eight bytes of ones, in place of the
// InfiniBand local route header RoCE lacks), the IP header with its
// traffic class, TTL/hop limit, checksum and flow label masked, the UDP
// header with its checksum masked, and the BTH with its reserved byte 4
// (FECN, BECN) masked; then the rest of the transport part as it is.

var maskedLRH = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// ICRC computes the invariant CRC of a RoCEv2 packet from its IP header
// (IPv4 without options, 20 bytes, or IPv6, 40: what PseudoHeaders gives), its
// UDP header and its transport part (without the ICRC). The result is in
// the byte order it travels in: append it with binary.LittleEndian. It
// allocates its scratch space: a device uses ICRCScratch.ICRC.
func ICRC(ipHdr, udpHdr, transport []byte) uint32 {
	return new(ICRCScratch).ICRC(ipHdr, udpHdr, transport, nil, nil)
}

// ICRCScratch is the space an ICRC is computed in: the masked headers and
// the first bytes after them. Each goroutine that computes ICRCs keeps one
// (hash/crc32 would make a buffer on the stack escape, an allocation per
// packet).
type ICRCScratch [8 + 40 + 8 + BTHLen + 16]byte

// ICRC is the package's ICRC of a transport part held in three pieces,
// hdr, payload and tail (the pad), as a sender that does not copy the
// payload next to its headers has it; hdr holds at least the BTH.
//
// hash/crc32 is fast (carry-less multiplication) over whole 16-byte blocks
// of at least 64 bytes and slow (tables) over the rest, so the masked
// headers and the first bytes after them go through it as one block of at
// least 64 bytes, a multiple of 16: over IPv4 that leaves the rest of a
// packet with a 16-byte multiple of payload in whole blocks too.
func (s *ICRCScratch) ICRC(ipHdr, udpHdr, hdr, payload, tail []byte) uint32 {
	buf := s[:]
	n := copy(buf, maskedLRH[:])
	ip := n
	n += copy(buf[n:], ipHdr)
	if ipHdr[0]>>4 == 4 {
		buf[ip+1] = 0xff                    // TOS
		buf[ip+8] = 0xff                    // TTL
		buf[ip+10], buf[ip+11] = 0xff, 0xff // header checksum
	} else {
		buf[ip] |= 0x0f  // traffic class, high nibble
		buf[ip+1] = 0xff // traffic class, low nibble, and flow label
		buf[ip+2], buf[ip+3] = 0xff, 0xff
		buf[ip+7] = 0xff // hop limit
	}
	n += copy(buf[n:], udpHdr[:8])
	buf[n-2], buf[n-1] = 0xff, 0xff // UDP checksum
	bth := n
	n += copy(buf[n:], hdr[:BTHLen])
	buf[bth+4] = 0xff // FECN, BECN, reserved
	rest := [3][]byte{hdr[BTHLen:], payload, tail}
	block := max(64, (n+15)&^15)
	for i := range rest {
		k := copy(buf[n:block], rest[i])
		n += k
		rest[i] = rest[i][k:]
	}
	crc := crc32.Update(0, crc32.IEEETable, buf[:n])
	for _, b := range rest {
		crc = crc32.Update(crc, crc32.IEEETable, b)
	}
	return crc
}

// PseudoHeaders rebuilds the IP and UDP headers that Linux puts on a
// datagram of a RoCEv2 transport part of length n sent from src:srcPort to
// dst:UDPPort by an unconnected socket that sets DF: the fields the ICRC
// does not mask are all known (an IPv4 identification of 0 is what Linux
// gives unconnected DF datagrams), so sender and receiver both compute the
// packet's ICRC from them.
func PseudoHeaders(buf []byte, src, dst netip.Addr, srcPort uint16, n int) (ip, udp []byte) {
	udpLen := 8 + n + ICRCLen
	if src.Is4() && dst.Is4() {
		ip = buf[:20]
		clear(ip)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+udpLen))
		ip[6] = 0x40 // DF
		ip[9] = 17
		s, d := src.As4(), dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
	} else {
		ip = buf[:40]
		clear(ip)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(udpLen))
		ip[6] = 17
		s, d := src.As16(), dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
	}
	udp = buf[len(ip) : len(ip)+8]
	binary.BigEndian.PutUint16(udp[0:], srcPort)
	binary.BigEndian.PutUint16(udp[2:], UDPPort)
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	binary.BigEndian.PutUint16(udp[6:], 0)
	return ip, udp
}
