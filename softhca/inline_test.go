//go:build linux

package softhca_test

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// TestInlineCap: a QP takes no more inline data than a send WQE can carry
// (the control segment counts a WQE's size in a 6-bit field of 16-byte
// units: 1,008 bytes), and a post of as much inline data as its Cap
// reports arrives whole. A QP asked for 1,000 inline bytes reported 1,888
// and was made; a post of them failed on the device with LOC_QP_OP_ERR.
func TestInlineCap(t *testing.T) {
	f := softhca.NewFabric()
	a, b := verbstest.Connect(t, verbstest.Env{Name: "inline", Open: func(t testing.TB) (x, y *verbs.Context) {
		return open(t, newDevice(t, f)), open(t, newDevice(t, f))
	}}, 1<<16)
	attr := verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: a.CQ, RecvCQ: a.CQ,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 1000}}
	if qp, err := a.PD.CreateQP(&attr); !errors.Is(err, syscall.EINVAL) {
		if err == nil {
			qp.Close()
		}
		t.Fatalf("a QP of 1,000 inline bytes: %v, want EINVAL", err)
	}
	attr.Cap.MaxInlineData = 900
	qp, err := a.PD.CreateQP(&attr)
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	n := int(qp.Cap().MaxInlineData)
	if n < 900 {
		t.Fatalf("a QP asked for 900 inline bytes takes %d", n)
	}
	// A QP of b's for it: b.QP is a's QP's peer, and its PSNs are taken.
	peer, err := b.PD.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: b.CQ, RecvCQ: b.CQ,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	pa, err := a.Ctx.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := b.Ctx.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	verbstest.BringUp(t, peer, pa.GID, qp.Num())
	verbstest.BringUp(t, qp, pb.GID, peer.Num())
	src := a.Buf[:n]
	for i := range src {
		src[i] = byte(i*7 + 1)
	}
	if err := qp.PostSend(&verbs.SendWR{WRID: 9, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendInline | verbs.SendSignaled,
		SG: []verbs.SGE{a.MR.SGE(0, n)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()}); err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WorkCompletion, 1)
	for end := time.Now().Add(10 * time.Second); ; {
		if k, err := a.CQ.Poll(wc); err != nil {
			t.Fatal(err)
		} else if k == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("no completion")
		}
	}
	if wc[0].Status != verbs.WCSuccess || wc[0].WRID != 9 {
		t.Fatalf("inline write of %d bytes (the QP's cap): %+v", n, wc[0])
	}
	if !bytes.Equal(b.Buf[:n], src) {
		t.Fatalf("the %d bytes written inline did not arrive whole", n)
	}
}
