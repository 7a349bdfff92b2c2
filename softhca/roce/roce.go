// Package roce holds the InfiniBand transport headers that the software HCA
// exchanges between queue pairs: the base transport header (BTH) and the
// extended headers (RETH, AETH, AtomicETH, AtomicAckETH, ImmDt, XRCETH) that
// RoCEv2 carries over UDP port 4791, with the rules of which opcode carries
// which header.
package roce

import "fmt"

// Opcode is a BTH opcode: a transport prefix (the top three bits) and an
// operation.
type Opcode uint8

// Transport prefixes.
const (
	TransportRC  Opcode = 0x00
	TransportUC  Opcode = 0x20
	TransportRD  Opcode = 0x40
	TransportUD  Opcode = 0x60
	TransportCNP Opcode = 0x80
	TransportXRC Opcode = 0xa0
)

// Operations (the low five bits of an opcode).
const (
	SendFirst          Opcode = 0x00
	SendMiddle         Opcode = 0x01
	SendLast           Opcode = 0x02
	SendLastImm        Opcode = 0x03
	SendOnly           Opcode = 0x04
	SendOnlyImm        Opcode = 0x05
	WriteFirst         Opcode = 0x06
	WriteMiddle        Opcode = 0x07
	WriteLast          Opcode = 0x08
	WriteLastImm       Opcode = 0x09
	WriteOnly          Opcode = 0x0a
	WriteOnlyImm       Opcode = 0x0b
	ReadRequest        Opcode = 0x0c
	ReadResponseFirst  Opcode = 0x0d
	ReadResponseMiddle Opcode = 0x0e
	ReadResponseLast   Opcode = 0x0f
	ReadResponseOnly   Opcode = 0x10
	Acknowledge        Opcode = 0x11
	AtomicAcknowledge  Opcode = 0x12
	CompareSwap        Opcode = 0x13
	FetchAdd           Opcode = 0x14
	SendLastInv        Opcode = 0x16
	SendOnlyInv        Opcode = 0x17
)

// Transport returns the opcode's transport prefix.
func (o Opcode) Transport() Opcode { return o & 0xe0 }

// Op returns the operation without the transport prefix.
func (o Opcode) Op() Opcode { return o & 0x1f }

var opNames = map[Opcode]string{
	SendFirst: "SEND_FIRST", SendMiddle: "SEND_MIDDLE", SendLast: "SEND_LAST",
	SendLastImm: "SEND_LAST_WITH_IMMEDIATE", SendOnly: "SEND_ONLY", SendOnlyImm: "SEND_ONLY_WITH_IMMEDIATE",
	WriteFirst: "RDMA_WRITE_FIRST", WriteMiddle: "RDMA_WRITE_MIDDLE", WriteLast: "RDMA_WRITE_LAST",
	WriteLastImm: "RDMA_WRITE_LAST_WITH_IMMEDIATE", WriteOnly: "RDMA_WRITE_ONLY",
	WriteOnlyImm: "RDMA_WRITE_ONLY_WITH_IMMEDIATE", ReadRequest: "RDMA_READ_REQUEST",
	ReadResponseFirst: "RDMA_READ_RESPONSE_FIRST", ReadResponseMiddle: "RDMA_READ_RESPONSE_MIDDLE",
	ReadResponseLast: "RDMA_READ_RESPONSE_LAST", ReadResponseOnly: "RDMA_READ_RESPONSE_ONLY",
	Acknowledge: "ACKNOWLEDGE", AtomicAcknowledge: "ATOMIC_ACKNOWLEDGE", CompareSwap: "COMPARE_SWAP",
	FetchAdd: "FETCH_ADD", SendLastInv: "SEND_LAST_WITH_INVALIDATE", SendOnlyInv: "SEND_ONLY_WITH_INVALIDATE",
}

var transportNames = map[Opcode]string{
	TransportRC: "RC", TransportUC: "UC", TransportRD: "RD", TransportUD: "UD", TransportCNP: "CNP", TransportXRC: "XRC",
}

func (o Opcode) String() string {
	t, ok1 := transportNames[o.Transport()]
	n, ok2 := opNames[o.Op()]
	if ok1 && ok2 {
		return t + "_" + n
	}
	return fmt.Sprintf("Opcode(%#02x)", uint8(o))
}

// Header flags of an operation.
const (
	hasRETH = 1 << iota
	hasAETH
	hasAtomicETH
	hasAtomicAckETH
	hasImm
	hasIETH
	hasPayload
	isRequest
	isFirst // first packet of a message (or only)
	isLast  // last packet of a message (or only)
	isSend
	isWrite
	isRead
	isAtomic
	isAck
)

var opFlags = [32]uint32{
	SendFirst:          isRequest | isSend | isFirst | hasPayload,
	SendMiddle:         isRequest | isSend | hasPayload,
	SendLast:           isRequest | isSend | isLast | hasPayload,
	SendLastImm:        isRequest | isSend | isLast | hasPayload | hasImm,
	SendOnly:           isRequest | isSend | isFirst | isLast | hasPayload,
	SendOnlyImm:        isRequest | isSend | isFirst | isLast | hasPayload | hasImm,
	WriteFirst:         isRequest | isWrite | isFirst | hasPayload | hasRETH,
	WriteMiddle:        isRequest | isWrite | hasPayload,
	WriteLast:          isRequest | isWrite | isLast | hasPayload,
	WriteLastImm:       isRequest | isWrite | isLast | hasPayload | hasImm,
	WriteOnly:          isRequest | isWrite | isFirst | isLast | hasPayload | hasRETH,
	WriteOnlyImm:       isRequest | isWrite | isFirst | isLast | hasPayload | hasRETH | hasImm,
	ReadRequest:        isRequest | isRead | isFirst | isLast | hasRETH,
	ReadResponseFirst:  isAck | isRead | isFirst | hasPayload | hasAETH,
	ReadResponseMiddle: isAck | isRead | hasPayload,
	ReadResponseLast:   isAck | isRead | isLast | hasPayload | hasAETH,
	ReadResponseOnly:   isAck | isRead | isFirst | isLast | hasPayload | hasAETH,
	Acknowledge:        isAck | hasAETH,
	AtomicAcknowledge:  isAck | isAtomic | hasAETH | hasAtomicAckETH,
	CompareSwap:        isRequest | isAtomic | isFirst | isLast | hasAtomicETH,
	FetchAdd:           isRequest | isAtomic | isFirst | isLast | hasAtomicETH,
	SendLastInv:        isRequest | isSend | isLast | hasPayload | hasIETH,
	SendOnlyInv:        isRequest | isSend | isFirst | isLast | hasPayload | hasIETH,
}

func (o Opcode) flags() uint32 { return opFlags[o.Op()] }

// Valid reports whether the opcode is a defined operation of the RC, UC,
// UD or XRC transports.
func (o Opcode) Valid() bool {
	f := o.flags()
	switch o.Transport() {
	case TransportRC, TransportXRC:
		return f != 0
	case TransportUC:
		return f&(isSend|isWrite) != 0 && f&hasIETH == 0
	case TransportUD:
		return o.Op() == SendOnly || o.Op() == SendOnlyImm
	}
	return false
}

// HasDETH reports whether the opcode carries a DETH: every UD packet.
func (o Opcode) HasDETH() bool { return o.Transport() == TransportUD }

func (o Opcode) HasRETH() bool         { return o.flags()&hasRETH != 0 }
func (o Opcode) HasAETH() bool         { return o.flags()&hasAETH != 0 }
func (o Opcode) HasAtomicETH() bool    { return o.flags()&hasAtomicETH != 0 }
func (o Opcode) HasAtomicAckETH() bool { return o.flags()&hasAtomicAckETH != 0 }
func (o Opcode) HasImm() bool          { return o.flags()&hasImm != 0 }
func (o Opcode) HasIETH() bool         { return o.flags()&hasIETH != 0 }
func (o Opcode) HasPayload() bool      { return o.flags()&hasPayload != 0 }
func (o Opcode) IsRequest() bool       { return o.flags()&isRequest != 0 }
func (o Opcode) IsFirst() bool         { return o.flags()&isFirst != 0 }
func (o Opcode) IsLast() bool          { return o.flags()&isLast != 0 }
func (o Opcode) IsSend() bool          { return o.flags()&isSend != 0 }
func (o Opcode) IsWrite() bool         { return o.flags()&isWrite != 0 }
func (o Opcode) IsRead() bool          { return o.flags()&isRead != 0 }
func (o Opcode) IsAtomic() bool        { return o.flags()&isAtomic != 0 }

// IsResponse reports whether the opcode travels from responder to
// requester (acknowledgements and read responses).
func (o Opcode) IsResponse() bool { return o.flags()&isAck != 0 }

// HasXRCETH reports whether the opcode carries an XRCETH: every XRC request.
func (o Opcode) HasXRCETH() bool { return o.Transport() == TransportXRC && o.IsRequest() }

// AETH syndromes: the top three bits select ACK, RNR NAK or NAK; the low
// five bits are a credit count, an RNR timer code, or a NAK code.
const (
	AETHAck    = 0x00
	AETHRNRNak = 0x20
	AETHNak    = 0x60
	AETHKind   = 0x60 // mask of the kind bits (bit 7 is reserved)

	AETHInvalidCredits = 0x1f

	NakPSNSeqErr      = 0
	NakInvalidRequest = 1
	NakRemoteAccess   = 2
	NakRemoteOpErr    = 3
	NakInvalidRDReq   = 4
)

// PSNMask keeps the 24 bits of a packet sequence number.
const PSNMask = 0xffffff

// MaxMessagePackets is the most packets one message may take. PSNDiff
// compares PSNs within half the PSN space, so every PSN a requester has
// outstanding must lie less than 2^23 past the last acknowledged one: a
// message's packets (a READ's responses) after the PSN before its first.
// A message of 2^31 bytes, the largest there is, takes 2^23 packets at an
// MTU of 256, one too many.
const MaxMessagePackets = 1<<23 - 1

// PSNDiff returns a-b as a signed distance in the 24-bit PSN space.
func PSNDiff(a, b uint32) int32 {
	return int32((a-b)<<8) >> 8
}

// Packet is a decoded transport packet. Payload is the data after the
// headers; who owns its memory is stated by whoever hands the packet over.
type Packet struct {
	Opcode Opcode
	SE     bool // solicited event
	MigReq bool
	Pad    uint8 // pad count
	TVer   uint8
	PKey   uint16
	DestQP uint32
	AckReq bool
	PSN    uint32
	// Reserved bits, kept so that a decoded packet encodes to the same
	// bytes: BTH byte 4 (FECN, BECN and reserved bits on RoCE) and the
	// seven bits after the AckReq bit.
	Resv8a uint8
	Resv7  uint8
	// The reserved bytes of the XRCETH and the DETH.
	XRCResv  uint8
	DETHResv uint8

	// XRCETH
	XRCSRQ uint32
	// DETH
	QKey  uint32
	SrcQP uint32
	// RETH
	VA     uint64
	RKey   uint32
	DMALen uint32
	// AETH
	Syndrome uint8
	MSN      uint32
	// AtomicETH (VA and RKey above)
	SwapAdd uint64
	Compare uint64
	// AtomicAckETH
	OrigData uint64
	// ImmDt, or the IETH key
	Imm uint32

	Payload []byte

	// Addressing outside the transport headers (IP addresses in RoCEv2).
	SrcGID [16]byte
	DstGID [16]byte

	// Storage is memory the packet's owner keeps for payloads; Payload may
	// point into it or elsewhere (the datagram a packet was parsed from).
	// The codec neither reads nor writes it.
	Storage []byte
}
