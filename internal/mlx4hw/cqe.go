package mlx4hw

import (
	"encoding/binary"
	"fmt"
)

// CQE is a decoded 32-byte completion queue entry. For an error CQE
// (Opcode CQEOpError) VendorErr and Syndrome are set instead of Checksum.
type CQE struct {
	MyQPN     uint32 // the local QP (with XRCQPNBit for XRC QPs)
	Immed     uint32 // immediate data (or invalidated key), as sent
	GMLPath   uint32 // bit 31: GRH present; bits 24-30: path bits; low 24: remote QPN or XRC SRQN
	SLVID     uint16
	RLID      uint16
	Status    uint32
	ByteCnt   uint32
	WQEIndex  uint16
	Checksum  uint16
	Owner     bool
	IsSend    bool
	Opcode    uint8
	VendorErr uint8
	Syndrome  uint8
}

// IsError reports whether the CQE reports an error.
func (c *CQE) IsError() bool { return c.Opcode == CQEOpError }

// CQEOwner returns the owner bit of the CQE at b without decoding the rest;
// it loads the last word atomically.
func CQEOwner(b []byte) bool { return LoadBE32(b[28:])&CQEOwnerMask != 0 }

// DecodeCQE decodes the CQE in b[:CQESize]. It reads the last word (owner
// and opcode) atomically, first.
func DecodeCQE(b []byte) (CQE, error) {
	var c CQE
	if len(b) < CQESize {
		return c, fmt.Errorf("cqe: %d bytes, need %d", len(b), CQESize)
	}
	last := LoadBE32(b[28:])
	osr := uint8(last)
	c.Owner = osr&CQEOwnerMask != 0
	c.IsSend = osr&CQEIsSendMask != 0
	c.Opcode = osr & CQEOpcodeMask
	c.MyQPN = binary.BigEndian.Uint32(b[0:]) & CQEQPNMask
	c.Immed = binary.BigEndian.Uint32(b[4:])
	c.GMLPath = binary.BigEndian.Uint32(b[8:])
	c.SLVID = binary.BigEndian.Uint16(b[12:])
	c.RLID = binary.BigEndian.Uint16(b[14:])
	c.Status = binary.BigEndian.Uint32(b[16:])
	c.ByteCnt = binary.BigEndian.Uint32(b[20:])
	c.WQEIndex = binary.BigEndian.Uint16(b[24:])
	if c.IsError() {
		c.VendorErr = b[26]
		c.Syndrome = b[27]
	} else {
		c.Checksum = binary.BigEndian.Uint16(b[26:])
	}
	return c, nil
}

// Put writes c into b[:CQESize]: everything but the last word, then the last
// word (with the owner bit) atomically, so that a poller that sees the new
// owner sees the whole entry.
func (c *CQE) Put(b []byte) {
	_ = b[CQESize-1]
	binary.BigEndian.PutUint32(b[0:], c.MyQPN&CQEQPNMask)
	binary.BigEndian.PutUint32(b[4:], c.Immed)
	binary.BigEndian.PutUint32(b[8:], c.GMLPath)
	binary.BigEndian.PutUint16(b[12:], c.SLVID)
	binary.BigEndian.PutUint16(b[14:], c.RLID)
	binary.BigEndian.PutUint32(b[16:], c.Status)
	binary.BigEndian.PutUint32(b[20:], c.ByteCnt)
	binary.BigEndian.PutUint16(b[24:], c.WQEIndex)
	if c.IsError() {
		b[26] = c.VendorErr
		b[27] = c.Syndrome
	} else {
		binary.BigEndian.PutUint16(b[26:], c.Checksum)
	}
	osr := c.Opcode & CQEOpcodeMask
	if c.IsSend {
		osr |= CQEIsSendMask
	}
	if c.Owner {
		osr |= CQEOwnerMask
	}
	StoreBE32(b[28:], uint32(osr))
}
