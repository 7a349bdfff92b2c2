//go:build linux

package softhca_test

import (
	"os"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// TestInlineCapHonoured: a post of as much inline data as the QP's Cap
// reports succeeds (pre-existing, not part of the packed change).
func TestInlineCapHonoured(t *testing.T) {
	if os.Getenv("REV_PREEXISTING") == "" {
		t.Skip("pre-existing defect outside the reviewed change; REV_PREEXISTING=1 to run")
	}
	f := softhca.NewFabric()
	a, b := verbstest.Connect(t, verbstest.Env{Name: "x", Open: func(t testing.TB) (x, y *verbs.Context) {
		return open(t, newDevice(t, f)), open(t, newDevice(t, f))
	}}, 1<<16)
	_ = b
	qp, err := a.PD.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: a.CQ, RecvCQ: a.CQ,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	p, _ := b.Ctx.QueryPort(1)
	verbstest.BringUp(t, qp, p.GID, b.QP.Num())
	n := int(qp.Cap().MaxInlineData)
	t.Logf("cap inline %d", n)
	if err := qp.PostSend(&verbs.SendWR{WRID: 9, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendInline | verbs.SendSignaled,
		SG: []verbs.SGE{a.MR.SGE(0, n)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()}); err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WorkCompletion, 1)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		if k, _ := a.CQ.Poll(wc); k == 1 {
			if wc[0].Status != verbs.WCSuccess {
				t.Fatalf("inline write of %d bytes (the QP's cap): %v", n, wc[0].Status)
			}
			return
		}
	}
	t.Fatal("no completion")
}
