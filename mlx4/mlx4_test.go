package mlx4

import (
	"bytes"
	"errors"
	"syscall"
	"testing"

	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/verbs"
)

// recordUAR remembers doorbell writes.
type recordUAR struct{ w32 []uint32 }

func (u *recordUAR) Write32(off int, v uint32) { u.w32 = append(u.w32, uint32(off), v) }
func (u *recordUAR) Write64(off int, v uint64) {}
func (u *recordUAR) Close() error              { return nil }

// testQP is a QP with a send queue and no device behind it.
func testQP(t *testing.T, c verbs.QPCap) (*QP, *recordUAR) {
	uar := &recordUAR{}
	qp := &QP{ctx: &Context{uar: uar}, qpn: 0x48}
	qp.sq.shift = sqWQEShift(c)
	qp.spare = (2048 >> qp.sq.shift) + 1
	qp.sq.cnt = roundPow2(c.MaxSendWR + qp.spare)
	qp.sq.buf = make([]byte, int(qp.sq.cnt)<<qp.sq.shift)
	qp.sq.wrid = make([]uint64, qp.sq.cnt)
	qp.sq.maxPost = qp.sq.cnt - qp.spare
	wqeSize := 1<<qp.sq.shift - mlx4hw.CtrlSegSize - mlx4hw.RaddrSegSize
	qp.sq.maxGS = int32(wqeSize / mlx4hw.DataSegSize)
	qp.maxInline = wqeSize - mlx4hw.InlineHdrSize*((wqeSize+mlx4hw.InlineAlign-1)/mlx4hw.InlineAlign)
	qp.initSQOwnership()
	return qp, uar
}

func TestPostSendEncoding(t *testing.T) {
	qp, uar := testQP(t, verbs.QPCap{MaxSendWR: 16, MaxSendSGE: 3, MaxInlineData: 256})
	src := make([]byte, 300)
	for i := range src {
		src[i] = byte(i * 3)
	}
	addr := uint64(unix.AddrOf(src))
	wrs := []verbs.SendWR{
		{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{{Addr: 100, Length: 10, LKey: 5}, {Addr: 200, Length: 0, LKey: 6}}},
		{WRID: 2, Opcode: verbs.WRRDMAWriteWithImm, Imm: 0xabcd, SG: []verbs.SGE{{Addr: 1, Length: 2, LKey: 3}}, RemoteAddr: 0x9000, RKey: 44},
		{WRID: 3, Opcode: verbs.WRAtomicCmpAndSwp, SG: []verbs.SGE{{Addr: 8, Length: 8, LKey: 1}}, RemoteAddr: 0x10, RKey: 2, CompareAdd: 7, Swap: 8},
		{WRID: 4, Opcode: verbs.WRAtomicFetchAdd, SG: []verbs.SGE{{Addr: 8, Length: 8, LKey: 1}}, RemoteAddr: 0x10, RKey: 2, CompareAdd: 9},
		{WRID: 5, Opcode: verbs.WRSend, Flags: verbs.SendInline | verbs.SendSolicited, SG: []verbs.SGE{{Addr: addr, Length: 100}, {Addr: addr + 150, Length: 150}}},
	}
	for i := range wrs[:len(wrs)-1] {
		wrs[i].Next = &wrs[i+1]
	}
	if err := qp.PostSend(&wrs[0]); err != nil {
		t.Fatal(err)
	}
	if len(uar.w32) != 2 || uar.w32[0] != mlx4hw.UARSendDoorbell || uar.w32[1] != 0x48<<8 {
		t.Fatalf("doorbells %x, want one of qpn<<8", uar.w32)
	}
	var w mlx4hw.SendWQE
	decode := func(i uint32) {
		w.SG, w.Inline = w.SG[:0], w.Inline[:0]
		if err := mlx4hw.DecodeSendWQE(qp.sq.slot(i), &w); err != nil {
			t.Fatalf("wqe %d: %v", i, err)
		}
		if w.Owner { // first pass: owner bit clear
			t.Fatalf("wqe %d: owner bit set on the first pass", i)
		}
		if qp.sq.wrid[i] != wrs[i].WRID {
			t.Fatalf("wqe %d: wr_id %d", i, qp.sq.wrid[i])
		}
	}
	decode(0)
	if w.Opcode != mlx4hw.OpSend || !w.Signaled() || len(w.SG) != 1 || w.SG[0] != (mlx4hw.DataSeg{ByteCount: 10, LKey: 5, Addr: 100}) {
		t.Fatalf("send: %+v", w)
	}
	decode(1)
	if w.Opcode != mlx4hw.OpRDMAWriteImm || w.Signaled() || w.Imm != 0xabcd || w.RemoteAddr != 0x9000 || w.RKey != 44 || len(w.SG) != 1 {
		t.Fatalf("write with imm: %+v", w)
	}
	decode(2)
	if w.Opcode != mlx4hw.OpAtomicCS || w.Compare != 7 || w.SwapAdd != 8 || w.RKey != 2 {
		t.Fatalf("cmp-swap: %+v", w)
	}
	decode(3)
	if w.Opcode != mlx4hw.OpAtomicFA || w.SwapAdd != 9 {
		t.Fatalf("fetch-add: %+v", w)
	}
	decode(4)
	want := append(append([]byte(nil), src[:100]...), src[150:300]...)
	if w.Opcode != mlx4hw.OpSend || !w.HasInline || !bytes.Equal(w.Inline, want) || w.Flags&mlx4hw.CtrlSolicit == 0 {
		t.Fatalf("inline: %d bytes, solicit %v", len(w.Inline), w.Flags&mlx4hw.CtrlSolicit != 0)
	}
	// The next slot is still the device's.
	w.SG = w.SG[:0]
	mlx4hw.DecodeSendWQE(qp.sq.slot(5), &w)
	if !w.Owner {
		t.Fatal("slot 5 looks posted")
	}
}

// TestInlineSegments checks every inline size up to the maximum: segments
// never cross a 64-byte boundary and the data comes back whole.
func TestInlineSegments(t *testing.T) {
	qp, _ := testQP(t, verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1, MaxInlineData: 400})
	if qp.maxInline < 400 {
		t.Fatalf("QP takes %d inline bytes, asked for 400", qp.maxInline)
	}
	src := make([]byte, qp.maxInline)
	for i := range src {
		src[i] = byte(i)
	}
	addr := uint64(unix.AddrOf(src))
	var w mlx4hw.SendWQE
	for n := 1; n <= qp.maxInline; n++ {
		for _, op := range []verbs.WROpcode{verbs.WRSend, verbs.WRRDMAWrite} {
			slot := make([]byte, 1<<qp.sq.shift)
			start := map[verbs.WROpcode]int{verbs.WRSend: 16, verbs.WRRDMAWrite: 32}[op]
			off := putInline(slot, start, []verbs.SGE{{Addr: addr, Length: uint32(n)}})
			for p := start; p < off; {
				dw := uint32(slot[p])<<24 | uint32(slot[p+1])<<16 | uint32(slot[p+2])<<8 | uint32(slot[p+3])
				if dw&mlx4hw.InlineFlag == 0 {
					t.Fatalf("%d bytes: no segment header at %d", n, p)
				}
				l := int(dw &^ mlx4hw.InlineFlag)
				if p/64 != (p+4+l-1)/64 {
					t.Fatalf("%d bytes: segment at %d of %d bytes crosses a boundary", n, p, l)
				}
				p += 4 + l
			}
			opc := uint32(mlx4hw.OpSend)
			if op == verbs.WRRDMAWrite {
				opc = mlx4hw.OpRDMAWrite
			}
			if op == verbs.WRRDMAWrite {
				mlx4hw.PutRaddrSeg(slot[16:], 0, 0)
			}
			mlx4hw.PutCtrl(slot, (off+15)/16, false, 0, 0)
			mlx4hw.StoreBE32(slot, opc)
			w.SG, w.Inline = w.SG[:0], w.Inline[:0]
			if err := mlx4hw.DecodeSendWQE(slot, &w); err != nil || !bytes.Equal(w.Inline, src[:n]) {
				t.Fatalf("%d inline bytes: decoded %d bytes, %v", n, len(w.Inline), err)
			}
		}
	}
}

func TestPostSendFull(t *testing.T) {
	qp, _ := testQP(t, verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1})
	n := int(qp.sq.maxPost)
	wrs := make([]verbs.SendWR, n+1)
	for i := range wrs {
		wrs[i] = verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSend}
		if i > 0 {
			wrs[i-1].Next = &wrs[i]
		}
	}
	err := qp.PostSend(&wrs[0])
	perr, ok := err.(*verbs.PostError)
	if !ok || perr.Index != n {
		t.Fatalf("posting %d requests into %d slots: %v", n+1, n, err)
	}
}

// TestPostAtomicSGEs: an atomic's segment takes one SGE's room in its
// slot, so an atomic with as many SGEs as other requests take is refused
// (it used to write past the slot and panic), and one with one SGE less
// is posted.
func TestPostAtomicSGEs(t *testing.T) {
	for _, op := range []verbs.WROpcode{verbs.WRAtomicFetchAdd, verbs.WRAtomicCmpAndSwp} {
		qp, _ := testQP(t, verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 2})
		n := int(qp.sq.maxGS)
		sg := make([]verbs.SGE, n)
		for i := range sg {
			sg[i] = verbs.SGE{Addr: 0x1000, Length: 8, LKey: 1}
		}
		err := qp.PostSend(&verbs.SendWR{Opcode: op, SG: sg, RemoteAddr: 0x2000, RKey: 1})
		if !errors.Is(err, syscall.ENOMEM) {
			t.Errorf("%v with %d SGEs in a slot of %d: %v", op, n, n, err)
		}
		if err := qp.PostSend(&verbs.SendWR{Opcode: op, SG: sg[:n-1], RemoteAddr: 0x2000, RKey: 1}); err != nil {
			t.Errorf("%v with %d SGEs: %v", op, n-1, err)
		}
	}
}

func TestSyndromes(t *testing.T) {
	for syn, want := range map[uint8]verbs.WCStatus{
		mlx4hw.SyndromeLocalLengthErr: verbs.WCLocLenErr, mlx4hw.SyndromeLocalQPOpErr: verbs.WCLocQPOpErr,
		mlx4hw.SyndromeLocalProtErr: verbs.WCLocProtErr, mlx4hw.SyndromeWRFlushErr: verbs.WCWRFlushErr,
		mlx4hw.SyndromeRemoteInvalReqErr: verbs.WCRemInvReqErr, mlx4hw.SyndromeRemoteAccessErr: verbs.WCRemAccessErr,
		mlx4hw.SyndromeRemoteOpErr: verbs.WCRemOpErr, mlx4hw.SyndromeRetryExcErr: verbs.WCRetryExcErr,
		mlx4hw.SyndromeRNRRetryExcErr: verbs.WCRNRRetryExcErr, mlx4hw.SyndromeBadRespErr: verbs.WCBadRespErr,
		0x7f: verbs.WCGeneralErr,
	} {
		e := mlx4hw.CQE{Opcode: mlx4hw.CQEOpError, Syndrome: syn, VendorErr: 3}
		var wc verbs.WorkCompletion
		fillWC(&e, &wc)
		if wc.Status != want || wc.VendorErr != 3 {
			t.Errorf("syndrome %#x: %v, want %v", syn, wc.Status, want)
		}
	}
}

func FuzzFillWC(f *testing.F) {
	b := make([]byte, mlx4hw.CQESize)
	(&mlx4hw.CQE{MyQPN: 0x48, Opcode: mlx4hw.RecvOpSendImm, Immed: 5, ByteCnt: 100}).Put(b)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := mlx4hw.DecodeCQE(b)
		if err != nil {
			return
		}
		var wc verbs.WorkCompletion
		fillWC(&e, &wc)
		if wc.Status > verbs.WCGeneralErr || wc.Status == verbs.WCSuccess && wc.Opcode.String()[0] == 'W' {
			t.Fatalf("completion %+v from %+v", wc, e)
		}
		if wc.QPNum != e.MyQPN {
			t.Fatal("qp number")
		}
		// The CQE written back (CQE.Put) decodes to the same CQE and
		// completion: fillWC reads only what the entry holds.
		out := make([]byte, mlx4hw.CQESize)
		e.Put(out)
		e2, err := mlx4hw.DecodeCQE(out)
		if err != nil || e2 != e {
			t.Fatalf("%+v written back decodes as %+v, %v", e, e2, err)
		}
		var wc2 verbs.WorkCompletion
		fillWC(&e2, &wc2)
		if wc2 != wc {
			t.Fatalf("%+v written back completes as %+v, not %+v", e, wc2, wc)
		}
		// What the completion carries is the entry's.
		switch {
		case e.IsError():
			if wc.VendorErr != uint32(e.VendorErr) || wc.Status == verbs.WCSuccess {
				t.Fatalf("error %+v completes as %+v", e, wc)
			}
		case e.IsSend:
			if wc.Flags&^verbs.WCWithImm != 0 || wc.Imm != 0 || wc.Opcode == verbs.WCRDMARead && wc.ByteLen != e.ByteCnt {
				t.Fatalf("send %+v completes as %+v", e, wc)
			}
		default:
			if wc.ByteLen != e.ByteCnt || wc.SLID != e.RLID || wc.SrcQP != e.GMLPath&0xffffff ||
				wc.DLIDPathBits != uint8(e.GMLPath>>24)&0x7f || (wc.Flags&verbs.WCWithGRH != 0) != (e.GMLPath>>31 != 0) ||
				wc.SL != uint8(e.SLVID>>13) || wc.Flags&verbs.WCWithImm != 0 && wc.Imm != e.Immed {
				t.Fatalf("receive %+v completes as %+v", e, wc)
			}
		}
	})
}
