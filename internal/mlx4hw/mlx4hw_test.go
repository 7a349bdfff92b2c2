package mlx4hw

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"
)

func TestCQERoundTrip(t *testing.T) {
	for _, c := range []CQE{
		{MyQPN: 0x123456, Immed: 0xdeadbeef, GMLPath: 1<<31 | 0x4567, SLVID: 0xe000, RLID: 7, Status: 1, ByteCnt: 4096,
			WQEIndex: 0xfffe, Checksum: 0xabcd, Owner: true, IsSend: false, Opcode: RecvOpSendImm},
		{MyQPN: 9, WQEIndex: 3, IsSend: true, Opcode: CQEOpError, Syndrome: SyndromeRemoteAccessErr, VendorErr: 0x88},
	} {
		b := make([]byte, CQESize)
		c.Put(b)
		got, err := DecodeCQE(b)
		if err != nil || got != c {
			t.Fatalf("round trip of %+v: %+v, %v", c, got, err)
		}
		if CQEOwner(b) != c.Owner {
			t.Fatal("owner bit")
		}
	}
	// The owner, send and opcode bits share the last byte.
	var c CQE
	b := make([]byte, CQESize)
	b[31] = CQEOwnerMask | CQEIsSendMask | OpRDMARead
	c, _ = DecodeCQE(b)
	if !c.Owner || !c.IsSend || c.Opcode != OpRDMARead {
		t.Fatalf("last byte decoded as %+v", c)
	}
}

func FuzzDecodeCQE(f *testing.F) {
	f.Add(make([]byte, CQESize))
	seed := make([]byte, CQESize)
	(&CQE{MyQPN: 0x48, IsSend: true, Opcode: CQEOpError, Syndrome: SyndromeWRFlushErr}).Put(seed)
	f.Add(seed)
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCQE(b)
		if len(b) < CQESize {
			if err == nil {
				t.Fatal("short CQE decoded")
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		// What was decoded encodes back to the same fields.
		out := make([]byte, CQESize)
		c.Put(out)
		c2, err := DecodeCQE(out)
		if err != nil || c2 != c {
			t.Fatalf("re-decoded %+v as %+v", c, c2)
		}
		if c.MyQPN > CQEQPNMask || c.Opcode > CQEOpcodeMask {
			t.Fatalf("field out of range: %+v", c)
		}
	})
}

// putSend writes a send WQE of size16 units with the given opcode, then its
// owner word.
func putSend(b []byte, op uint8, size16 int, owner bool) {
	PutCtrl(b, size16, false, CtrlCQUpdate|0x123<<8, 0x11223344)
	w := uint32(op)
	if owner {
		w |= OwnerBit
	}
	StoreBE32(b, w)
}

func TestDecodeSendWQE(t *testing.T) {
	b := make([]byte, 128)
	PutRaddrSeg(b[16:], 0x1000, 77)
	PutAtomicSeg(b[32:], 5, 6)
	PutDataSeg(b[48:], 8, 99, 0x2000)
	putSend(b, OpAtomicCS, 4, true)
	var w SendWQE
	if err := DecodeSendWQE(b, &w); err != nil {
		t.Fatal(err)
	}
	if !w.Owner || w.Opcode != OpAtomicCS || w.Size16 != 4 || !w.Signaled() || w.RemoteSRQN != 0x123 ||
		w.Imm != 0x11223344 || w.RemoteAddr != 0x1000 || w.RKey != 77 || w.SwapAdd != 5 || w.Compare != 6 ||
		len(w.SG) != 1 || w.SG[0] != (DataSeg{ByteCount: 8, LKey: 99, Addr: 0x2000}) {
		t.Fatalf("decoded %+v", w)
	}
	// A zero-length data segment is empty, not inline.
	clear(b)
	PutDataSeg(b[16:], 0, 1, 2)
	putSend(b, OpSend, 2, false)
	w = SendWQE{}
	if err := DecodeSendWQE(b, &w); err != nil || len(w.SG) != 0 || w.HasInline {
		t.Fatalf("zero-length segment: %+v %v", w, err)
	}
	// A descriptor larger than the slot is refused.
	putSend(b, OpSend, 9, false)
	if err := DecodeSendWQE(b, &w); err == nil {
		t.Fatal("oversized descriptor decoded")
	}
}

func FuzzDecodeSendWQE(f *testing.F) {
	b := make([]byte, 64)
	PutRaddrSeg(b[16:], 1, 2)
	PutDataSeg(b[32:], 100, 3, 4)
	putSend(b, OpRDMAWrite, 3, false)
	f.Add(b)
	in := make([]byte, 128)
	binary.BigEndian.PutUint32(in[16:], InlineFlag|44)
	copy(in[20:], bytes.Repeat([]byte{7}, 44))
	binary.BigEndian.PutUint32(in[64:], InlineFlag|10)
	putSend(in, OpSend, 5, true)
	f.Add(in)
	f.Fuzz(func(t *testing.T, b []byte) {
		var w SendWQE
		err := DecodeSendWQE(b, &w)
		if err != nil {
			return
		}
		if w.Size16 < 1 || w.Size16*16 > len(b) {
			t.Fatalf("accepted a descriptor of %d units in %d bytes", w.Size16, len(b))
		}
		if len(w.Inline) > w.Size16*16 || len(w.SG) > w.Size16 {
			t.Fatalf("decoded more than the descriptor holds: %d inline bytes, %d segments", len(w.Inline), len(w.SG))
		}
		// What was decoded, written back with the segment writers,
		// decodes to the same WQE. The writing is canonical: the data
		// segments, then the inline data in one segment, then empty
		// segments to the descriptor's size; it fits, as one inline
		// segment takes no more room than several. A data segment of
		// length 0 is written as an empty one (PutDataSeg; the device
		// skips both), so it is not decoded again.
		out := make([]byte, w.Size16*16)
		PutCtrl(out, w.Size16, w.Fence, w.RemoteSRQN<<8|uint32(w.Flags), w.Imm)
		off := CtrlSegSize
		if HasRaddr(w.Opcode) {
			PutRaddrSeg(out[off:], w.RemoteAddr, w.RKey)
			off += RaddrSegSize
		}
		if HasAtomic(w.Opcode) {
			PutAtomicSeg(out[off:], w.SwapAdd, w.Compare)
			off += AtomicSegSize
		}
		var sg []DataSeg
		for _, d := range w.SG {
			PutDataSeg(out[off:], d.ByteCount, d.LKey, d.Addr)
			off += DataSegSize
			if d.ByteCount != 0 {
				sg = append(sg, d)
			}
		}
		if w.HasInline {
			if off+InlineHdrSize+len(w.Inline) > len(out) {
				t.Fatalf("%d inline bytes do not fit back in the descriptor", len(w.Inline))
			}
			binary.BigEndian.PutUint32(out[off:], InlineFlag|uint32(len(w.Inline)))
			copy(out[off+InlineHdrSize:], w.Inline)
			off = (off + InlineHdrSize + len(w.Inline) + 15) &^ 15
		}
		for ; off < len(out); off += DataSegSize {
			PutDataSeg(out[off:], 0, 0, 0)
		}
		oo := uint32(w.Opcode)
		if w.Owner {
			oo |= OwnerBit
		}
		StoreBE32(out, oo)
		var w2 SendWQE
		if err := DecodeSendWQE(out, &w2); err != nil {
			t.Fatalf("%+v written back does not decode: %v", w, err)
		}
		if w2.Owner != w.Owner || w2.Opcode != w.Opcode || w2.Size16 != w.Size16 || w2.Fence != w.Fence ||
			w2.Flags != w.Flags || w2.RemoteSRQN != w.RemoteSRQN || w2.Imm != w.Imm ||
			w2.RemoteAddr != w.RemoteAddr || w2.RKey != w.RKey || w2.SwapAdd != w.SwapAdd || w2.Compare != w.Compare ||
			!slices.Equal(w2.SG, sg) || !bytes.Equal(w2.Inline, w.Inline) || w2.HasInline != w.HasInline {
			t.Fatalf("%+v written back decodes as %+v", w, w2)
		}
	})
}

func FuzzDecodeRecvSG(f *testing.F) {
	b := make([]byte, 64)
	PutRecvSG(b, []DataSeg{{ByteCount: 10, LKey: 5, Addr: 6}}, 4)
	f.Add(b, 4)
	f.Fuzz(func(t *testing.T, b []byte, maxGS int) {
		maxGS %= 64
		sg := DecodeRecvSG(b, maxGS, nil)
		if len(sg) > max(maxGS, 0) || len(sg)*DataSegSize > len(b) {
			t.Fatalf("%d segments from %d bytes (max %d)", len(sg), len(b), maxGS)
		}
		for _, s := range sg {
			if s.LKey == InvalidLKey || s.ByteCount&InlineFlag != 0 {
				t.Fatalf("segment %+v", s)
			}
		}
		// What was decoded, written back as a receive WQE's scatter
		// list, decodes to the same segments.
		out := make([]byte, (len(sg)+1)*DataSegSize)
		PutRecvSG(out, sg, maxGS)
		if again := DecodeRecvSG(out, maxGS, nil); !slices.Equal(again, sg) {
			t.Fatalf("%+v written back decodes as %+v", sg, again)
		}
	})
}
