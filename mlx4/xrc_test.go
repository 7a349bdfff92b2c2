package mlx4

import (
	"errors"
	"syscall"
	"testing"

	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/verbs"
)

// TestXRCRemoteSRQN checks that an XRC send QP puts the remote SRQ number
// of each request in the upper 24 bits of the control segment's
// srcrb_flags, beside the flags, as libmlx4 does, and that an RC QP does
// not.
func TestXRCRemoteSRQN(t *testing.T) {
	for _, typ := range []verbs.QPType{verbs.QPTXRCIni, verbs.QPTRC} {
		qp, _ := testQP(t, verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1})
		qp.typ = typ
		wr := verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled | verbs.SendSolicited,
			SG: []verbs.SGE{{Addr: 64, Length: 8, LKey: 3}}, RemoteSRQNum: 0xabcdef}
		if err := qp.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		var w mlx4hw.SendWQE
		if err := mlx4hw.DecodeSendWQE(qp.sq.slot(0), &w); err != nil {
			t.Fatal(err)
		}
		want := uint32(0)
		if typ == verbs.QPTXRCIni {
			want = 0xabcdef
		}
		if w.RemoteSRQN != want || !w.Signaled() || w.Flags&mlx4hw.CtrlSolicit == 0 {
			t.Fatalf("%v: remote srqn %#x flags %#x, want srqn %#x and the flags", typ, w.RemoteSRQN, w.Flags, want)
		}
	}
	tgt := &QP{typ: verbs.QPTXRCTgt}
	if err := tgt.PostSend(&verbs.SendWR{}); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("post send on an XRC receive QP: %v", err)
	}
	if err := tgt.PostRecv(&verbs.RecvWR{}); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("post recv on an XRC receive QP: %v", err)
	}
}

// testXSRQ is an XRC SRQ of n WQEs with no device behind it.
func testXSRQ(c *Context, srqn uint32, n uint32) *SRQ {
	s := &SRQ{ctx: c, srqn: srqn, max: n, shift: 5, maxGS: 1}
	s.buf = make([]byte, int(n)<<s.shift)
	s.wrid = make([]uint64, n)
	for i := range n {
		s.wrid[i] = 100*uint64(srqn) + uint64(i)
		mlx4hw.PutSRQNext(s.wqe(i), uint16((i+1)%n))
	}
	s.head, s.tail = 0, n-1
	c.xsrqs.put(srqn, s)
	return s
}

// TestXRCCompletion checks that a receive CQE of an XRC receive QP (the
// XRC bit in its QP number) is resolved through the SRQ number in its
// g_mlpath_rqpn word, that an unknown SRQ number is an error, and that
// cleaning an XRC SRQ's completions takes only its own.
func TestXRCCompletion(t *testing.T) {
	c := &Context{cqe: 32}
	cq := &CQ{ctx: c, n: 8, ring: ring{buf: make([]byte, 8*32), db: make([]byte, 8)}}
	for i := range cq.n {
		cq.entry(i)[31] = mlx4hw.CQEOwnerMask
	}
	s1, s2 := testXSRQ(c, 5, 4), testXSRQ(c, 6, 4)
	tgt := uint32(mlx4hw.XRCQPNBit | 0x49)
	put := func(i uint32, srqn uint32, idx uint16) {
		e := mlx4hw.CQE{MyQPN: tgt, GMLPath: 1<<31 | srqn, WQEIndex: idx, Opcode: mlx4hw.RecvOpSend, ByteCnt: 9}
		e.Put(cq.entry(i))
	}
	put(0, 5, 2)
	put(1, 6, 1)
	put(2, 5, 3)
	put(3, 77, 0)
	wc := make([]verbs.WorkCompletion, 2)
	n, err := cq.Poll(wc)
	if err != nil || n != 2 {
		t.Fatalf("poll: %d, %v", n, err)
	}
	if wc[0].WRID != s1.wrid[2] || wc[0].QPNum != tgt || wc[0].ByteLen != 9 || wc[1].WRID != s2.wrid[1] {
		t.Fatalf("completions %+v", wc)
	}
	cq.cleanXSRQ(s1) // takes entry 2, leaves the one of SRQ 77
	n, err = cq.Poll(wc)
	if !errors.Is(err, syscall.EIO) || n != 0 {
		t.Fatalf("poll of a CQE of an unknown XRC SRQ: %d, %v", n, err)
	}
	if s1.tail != 3 {
		t.Fatalf("the cleaned WQE did not go back to SRQ 5's free list: tail %d", s1.tail)
	}
}
