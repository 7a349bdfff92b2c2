package mlx4hw

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// SendWQE is a decoded send WQE of a connected (RC, UC, XRC) QP. Decoding
// appends to SG and Inline, so a caller that reuses a SendWQE (resetting the
// slices to length 0) decodes without allocating.
type SendWQE struct {
	Owner      bool
	Opcode     uint8
	Size16     int // descriptor size in 16-byte units
	Fence      bool
	Flags      uint8  // low byte of srcrb_flags: CtrlCQUpdate, CtrlSolicit, ...
	RemoteSRQN uint32 // XRC: the remote SRQ number (high 24 bits of srcrb_flags)
	Imm        uint32 // immediate data as the sender gave it
	RemoteAddr uint64
	RKey       uint32
	SwapAdd    uint64
	Compare    uint64
	SG         []DataSeg
	Inline     []byte
	HasInline  bool
}

// Signaled reports whether the WQE asks for a completion.
func (w *SendWQE) Signaled() bool { return w.Flags&CtrlCQUpdate != 0 }

// Errors of WQE decoding.
var (
	ErrWQESize   = errors.New("wqe: descriptor size out of range")
	ErrWQESegs   = errors.New("wqe: segments overrun the descriptor")
	ErrWQEOpcode = errors.New("wqe: unknown opcode")
)

// Ctrl segment accessors.

// OwnerOpcode is the first word of a send WQE.
func OwnerOpcode(b []byte) uint32 { return LoadBE32(b) }

// PutCtrl writes a control segment except its owner/opcode word, which the
// caller stores last with StoreBE32.
func PutCtrl(b []byte, size16 int, fence bool, srcrbFlags uint32, imm uint32) {
	fs := byte(size16 & 0x3f)
	if fence {
		fs |= CtrlFence
	}
	b[4], b[5], b[6] = 0, 0, 0
	b[7] = fs
	binary.BigEndian.PutUint32(b[8:], srcrbFlags)
	binary.BigEndian.PutUint32(b[12:], imm)
}

// HasRaddr reports whether a send opcode carries a remote address segment,
// and HasAtomic whether it carries an atomic segment.
func HasRaddr(op uint8) bool {
	switch op {
	case OpRDMAWrite, OpRDMAWriteImm, OpRDMARead, OpAtomicCS, OpAtomicFA:
		return true
	}
	return false
}

// HasAtomic reports whether a send opcode carries an atomic segment.
func HasAtomic(op uint8) bool { return op == OpAtomicCS || op == OpAtomicFA }

// DecodeSendWQE decodes the send WQE at the start of b, which holds the
// whole WQE slot. It validates sizes and segment bounds only; whether the
// opcode suits the QP is the caller's concern.
func DecodeSendWQE(b []byte, w *SendWQE) error {
	if len(b) < CtrlSegSize {
		return ErrWQESize
	}
	oo := LoadBE32(b)
	w.Owner = oo&OwnerBit != 0
	w.Opcode = uint8(oo & 0x1f)
	fs := b[7]
	w.Size16 = int(fs & 0x3f)
	w.Fence = fs&CtrlFence != 0
	f := binary.BigEndian.Uint32(b[8:])
	w.Flags = uint8(f)
	w.RemoteSRQN = f >> 8
	w.Imm = binary.BigEndian.Uint32(b[12:])
	w.RemoteAddr, w.RKey, w.SwapAdd, w.Compare = 0, 0, 0, 0
	w.HasInline = false
	end := w.Size16 * 16
	if w.Size16 < 1 || end > len(b) {
		return fmt.Errorf("%w: %d units in a %d-byte slot", ErrWQESize, w.Size16, len(b))
	}
	off := CtrlSegSize
	if HasRaddr(w.Opcode) {
		if off+RaddrSegSize > end {
			return ErrWQESegs
		}
		w.RemoteAddr = binary.BigEndian.Uint64(b[off:])
		w.RKey = binary.BigEndian.Uint32(b[off+8:])
		off += RaddrSegSize
	}
	if HasAtomic(w.Opcode) {
		if off+AtomicSegSize > end {
			return ErrWQESegs
		}
		w.SwapAdd = binary.BigEndian.Uint64(b[off:])
		w.Compare = binary.BigEndian.Uint64(b[off+8:])
		off += AtomicSegSize
	}
	for off < end {
		dw := binary.BigEndian.Uint32(b[off:])
		if dw&InlineFlag == 0 {
			if off+DataSegSize > end {
				return ErrWQESegs
			}
			w.SG = append(w.SG, DataSeg{
				ByteCount: dw,
				LKey:      binary.BigEndian.Uint32(b[off+4:]),
				Addr:      binary.BigEndian.Uint64(b[off+8:]),
			})
			off += DataSegSize
			continue
		}
		n := int(dw &^ InlineFlag)
		if n == 0 { // an empty data segment
			off += DataSegSize
			continue
		}
		if off+InlineHdrSize+n > end {
			return ErrWQESegs
		}
		w.Inline = append(w.Inline, b[off+InlineHdrSize:off+InlineHdrSize+n]...)
		w.HasInline = true
		off = (off + InlineHdrSize + n + 15) &^ 15
	}
	return nil
}

// DecodeRecvSG decodes the scatter list of a receive WQE of a receive queue
// (b starts at the WQE) or an SRQ (b starts after the next segment): up to
// maxGS data segments, ending early at one whose key is InvalidLKey.
func DecodeRecvSG(b []byte, maxGS int, sg []DataSeg) []DataSeg {
	for i := 0; i < maxGS && (i+1)*DataSegSize <= len(b); i++ {
		s := b[i*DataSegSize:]
		lkey := binary.BigEndian.Uint32(s[4:])
		if lkey == InvalidLKey {
			break
		}
		sg = append(sg, DataSeg{
			ByteCount: binary.BigEndian.Uint32(s[0:]) &^ InlineFlag,
			LKey:      lkey,
			Addr:      binary.BigEndian.Uint64(s[8:]),
		})
	}
	return sg
}

// SRQNext returns the next_wqe_index of an SRQ WQE.
func SRQNext(b []byte) uint16 { return binary.BigEndian.Uint16(b[2:]) }

// PutSRQNext sets the next_wqe_index of an SRQ WQE.
func PutSRQNext(b []byte, next uint16) { binary.BigEndian.PutUint16(b[2:], next) }

// PutRecvSG writes a receive scatter list and, when shorter than maxGS, the
// terminating entry.
func PutRecvSG(b []byte, sg []DataSeg, maxGS int) {
	for i, s := range sg {
		d := b[i*DataSegSize:]
		binary.BigEndian.PutUint32(d[0:], s.ByteCount)
		binary.BigEndian.PutUint32(d[4:], s.LKey)
		binary.BigEndian.PutUint64(d[8:], s.Addr)
	}
	if len(sg) < maxGS {
		d := b[len(sg)*DataSegSize:]
		binary.BigEndian.PutUint32(d[0:], 0)
		binary.BigEndian.PutUint32(d[4:], InvalidLKey)
		binary.BigEndian.PutUint64(d[8:], 0)
	}
}
