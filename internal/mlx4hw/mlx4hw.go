// Package mlx4hw is the hardware interface of ConnectX-3 (mlx4) HCAs that
// lives in process memory: the work queue entries a process writes into its
// send, receive and shared receive queues, the completion queue entries the
// device writes back, doorbell records and the offsets of the doorbell page
// (UAR). The mlx4 provider encodes WQEs and decodes CQEs with it; the
// software HCA does the reverse, as an mlx4 device would.
//
// All multi-byte fields are big-endian in memory. Words that hand an entry
// from one side to the other (a WQE's owner/opcode word, a CQE's last word,
// doorbell records) are accessed atomically with LoadBE32 and StoreBE32, so
// that the rest of the entry is visible before its owner changes.
package mlx4hw

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"
)

// Send WQE opcodes (the low bits of the control segment's owner_opcode).
const (
	OpNOP          = 0x00
	OpSendInval    = 0x01
	OpRDMAWrite    = 0x08
	OpRDMAWriteImm = 0x09
	OpSend         = 0x0a
	OpSendImm      = 0x0b
	OpLSO          = 0x0e
	OpRDMARead     = 0x10
	OpAtomicCS     = 0x11
	OpAtomicFA     = 0x12
	OpMaskedCS     = 0x14
	OpMaskedFA     = 0x15
	OpBindMW       = 0x18
	OpFMR          = 0x19
	OpLocalInval   = 0x1b
)

// Receive CQE opcodes.
const (
	RecvOpRDMAWriteImm = 0x00
	RecvOpSend         = 0x01
	RecvOpSendImm      = 0x02
	RecvOpSendInval    = 0x03
)

// CQE opcodes, masks and syndromes.
const (
	CQEOpError  = 0x1e
	CQEOpResize = 0x16

	CQEOwnerMask  = 0x80
	CQEIsSendMask = 0x40
	CQEOpcodeMask = 0x1f
	CQEQPNMask    = 0xffffff

	SyndromeLocalLengthErr    = 0x01
	SyndromeLocalQPOpErr      = 0x02
	SyndromeLocalProtErr      = 0x04
	SyndromeWRFlushErr        = 0x05
	SyndromeMWBindErr         = 0x06
	SyndromeBadRespErr        = 0x10
	SyndromeLocalAccessErr    = 0x11
	SyndromeRemoteInvalReqErr = 0x12
	SyndromeRemoteAccessErr   = 0x13
	SyndromeRemoteOpErr       = 0x14
	SyndromeRetryExcErr       = 0x15
	SyndromeRNRRetryExcErr    = 0x16
	SyndromeRemoteAbortedErr  = 0x22
)

// Control segment flags (the low byte of srcrb_flags), the owner bit, and
// the fence bit of fence_size.
const (
	CtrlSolicit     = 1 << 1
	CtrlCQUpdate    = 3 << 2
	CtrlFence       = 1 << 6
	CtrlStrongOrder = 1 << 7

	OwnerBit = 1 << 31
)

// Segment sizes and other layout constants.
const (
	CtrlSegSize    = 16
	RaddrSegSize   = 16
	AtomicSegSize  = 16
	DataSegSize    = 16
	SRQNextSegSize = 16
	InlineHdrSize  = 4
	InlineAlign    = 64 // inline segments never cross this boundary
	InlineFlag     = 1 << 31
	BasicBlockSize = 64 // send WQEs are whole basic blocks
	// MaxWQESize is the largest send WQE: its size, in 16-byte units,
	// fills the control segment's 6-bit field (the kernel's
	// max_sq_desc_sz).
	MaxWQESize  = 0x3f * 16
	CQESize     = 32
	InvalidLKey = 0x100 // terminates a receive scatter list
	// XRCQPNBit marks XRC QP numbers in CQEs.
	XRCQPNBit = 1 << 23
)

// UAR (doorbell page) offsets.
const (
	UARSendDoorbell = 0x14 // 32-bit write of qpn << 8
	UARCQDoorbell   = 0x20 // 64-bit write: sn<<60 | cmd<<56 | cqn<<32 | ci
)

// CQ doorbell commands (bits 24..27 of the arm word).
const (
	CQDBReqNotSol = 1 << 24 // next solicited or error completion
	CQDBReqNot    = 2 << 24 // next completion
	CQDBCmdMask   = 3 << 24
)

// Doorbell record sizes: a CQ's holds the consumer index and the arm word; a
// receive queue's (and an SRQ's) the producer counter.
const (
	CQDBRecSize = 8
	RQDBRecSize = 4
)

func ptr32(b []byte) *uint32 {
	_ = b[3]
	return (*uint32)(unsafe.Pointer(unsafe.SliceData(b)))
}

// NativeBE32 returns the native-order integer whose bytes in memory are v
// big-endian: the value to store for the device to read v.
func NativeBE32(v uint32) uint32 {
	var w [4]byte
	binary.BigEndian.PutUint32(w[:], v)
	return binary.NativeEndian.Uint32(w[:])
}

// NativeBE64 is NativeBE32 for 64-bit values.
func NativeBE64(v uint64) uint64 {
	var w [8]byte
	binary.BigEndian.PutUint64(w[:], v)
	return binary.NativeEndian.Uint64(w[:])
}

// LoadBE32 atomically loads the big-endian word at b[0:4], which must be
// 4-byte aligned.
func LoadBE32(b []byte) uint32 { return NativeBE32(atomic.LoadUint32(ptr32(b))) }

// StoreBE32 atomically stores v big-endian at b[0:4], which must be 4-byte
// aligned.
func StoreBE32(b []byte, v uint32) { atomic.StoreUint32(ptr32(b), NativeBE32(v)) }

// DataSeg is a data (scatter/gather) segment.
type DataSeg struct {
	ByteCount uint32
	LKey      uint32
	Addr      uint64
}

// PutDataSeg writes a data segment. A zero length is written as 0x80000000,
// which the device reads as an empty entry.
func PutDataSeg(b []byte, length, lkey uint32, addr uint64) {
	if length == 0 {
		length = InlineFlag
	}
	binary.BigEndian.PutUint32(b[4:], lkey)
	binary.BigEndian.PutUint64(b[8:], addr)
	binary.BigEndian.PutUint32(b[0:], length)
}

// PutRaddrSeg writes a remote address segment.
func PutRaddrSeg(b []byte, raddr uint64, rkey uint32) {
	binary.BigEndian.PutUint64(b[0:], raddr)
	binary.BigEndian.PutUint32(b[8:], rkey)
	binary.BigEndian.PutUint32(b[12:], 0)
}

// PutAtomicSeg writes an atomic segment: swap or add, and compare.
func PutAtomicSeg(b []byte, swapAdd, compare uint64) {
	binary.BigEndian.PutUint64(b[0:], swapAdd)
	binary.BigEndian.PutUint64(b[8:], compare)
}
