package softhca_test

import (
	"bytes"
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

func TestSmoke(t *testing.T) {
	dev, err := softhca.New(context.Background(), softhca.Config{Name: "smoke0", Addr: netip.MustParseAddr("127.0.1.1")})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	ctx, err := dev.Open(verbs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	attr, err := ctx.QueryDevice()
	t.Logf("attr %+v err %v", attr, err)
	port, err := ctx.QueryPort(1)
	t.Logf("port %+v err %v", port, err)
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	buf, _ := verbs.Alloc(8192)
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ctx.CreateCQ(16, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	mk := func() *verbs.QP {
		qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2}})
		if err != nil {
			t.Fatal(err)
		}
		return qp
	}
	a, b := mk(), mk()
	connect := func(q *verbs.QP, dst uint32) {
		if err := q.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: verbs.AccessRemoteWrite | verbs.AccessRemoteRead}, verbs.QPAttrState|verbs.QPAttrPkeyIndex|verbs.QPAttrPort|verbs.QPAttrAccessFlags); err != nil {
			t.Fatal(err)
		}
		if err := q.Modify(&verbs.QPAttr{State: verbs.QPSRTR, PathMTU: verbs.MTU1024, DestQPN: dst, RQPSN: 0, MaxDestRdAtomic: 1, MinRNRTimer: 1,
			AH: verbs.AHAttr{IsGlobal: true, Port: 1, GRH: verbs.GlobalRoute{DGID: port.GID, HopLimit: 1}}},
			verbs.QPAttrState|verbs.QPAttrAV|verbs.QPAttrPathMTU|verbs.QPAttrDestQPN|verbs.QPAttrRQPSN|verbs.QPAttrMaxDestRdAtomic|verbs.QPAttrMinRNRTimer); err != nil {
			t.Fatal(err)
		}
		if err := q.Modify(&verbs.QPAttr{State: verbs.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, SQPSN: 0, MaxRdAtomic: 1},
			verbs.QPAttrState|verbs.QPAttrTimeout|verbs.QPAttrRetryCnt|verbs.QPAttrRNRRetry|verbs.QPAttrSQPSN|verbs.QPAttrMaxQPRdAtomic); err != nil {
			t.Fatal(err)
		}
	}
	connect(a, b.Num())
	connect(b, a.Num())
	copy(buf, "hello world")
	if err := b.PostRecv(&verbs.RecvWR{WRID: 7, SG: []verbs.SGE{mr.SGE(4096, 100)}}); err != nil {
		t.Fatal(err)
	}
	if err := a.PostSend(&verbs.SendWR{WRID: 9, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{mr.SGE(0, 11)}}); err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WorkCompletion, 4)
	got := 0
	deadline := time.Now().Add(5 * time.Second)
	for got < 2 && time.Now().Before(deadline) {
		n, err := cq.Poll(wc[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	t.Logf("wcs %+v", wc[:got])
	if !bytes.Equal(buf[4096:4107], []byte("hello world")) {
		t.Fatalf("data %q", buf[4096:4107])
	}
}
