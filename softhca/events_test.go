package softhca_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

func nextEvent(t *testing.T, c *verbs.Context) verbs.AsyncEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := c.GetAsyncEvent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func TestPortEvents(t *testing.T) {
	d := newDevice(t, nil)
	c := open(t, d)
	d.SetPortActive(false)
	if ev := nextEvent(t, c); ev.Type != verbs.EventPortErr || ev.Port != 1 {
		t.Fatalf("event %+v, want PORT_ERR on port 1", ev)
	}
	if p, err := c.QueryPort(1); err != nil || p.State != verbs.PortDown {
		t.Fatalf("port %v, %v", p.State, err)
	}
	d.SetPortActive(true)
	if ev := nextEvent(t, c); ev.Type != verbs.EventPortActive || ev.Port != 1 {
		t.Fatalf("event %+v, want PORT_ACTIVE on port 1", ev)
	}
	if p, _ := c.QueryPort(1); p.State != verbs.PortActive {
		t.Fatalf("port %v", p.State)
	}
}

// TestCQOverrunIsFatal fills a receive CQ nobody polls: the CQ reports an
// error and the QP that completes into it fails with a QP fatal event.
func TestCQOverrunIsFatal(t *testing.T) {
	env := verbstest.Env{Open: func(t testing.TB) (a, b *verbs.Context) {
		d := newDevice(t, nil)
		return open(t, d), open(t, d)
	}}
	pa, pb := verbstest.Connect(t, env, 4096)
	small, err := pb.Ctx.CreateCQ(4, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	qa, err := pa.PD.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: pa.CQ, RecvCQ: pa.CQ, Cap: verbs.QPCap{MaxSendWR: 32, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer qa.Close()
	qb, err := pb.PD.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: pb.CQ, RecvCQ: small, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 32, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer qb.Close()
	pa0, _ := pa.Ctx.QueryPort(1)
	pb0, _ := pb.Ctx.QueryPort(1)
	verbstest.BringUp(t, qa, pb0.GID, qb.Num())
	verbstest.BringUp(t, qb, pa0.GID, qa.Num())
	n := small.CQE() + 2
	for range n {
		if err := qb.PostRecv(&verbs.RecvWR{SG: []verbs.SGE{pb.MR.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
		if err := qa.PostSend(&verbs.SendWR{Opcode: verbs.WRSend, SG: []verbs.SGE{pa.MR.SGE(0, 8)}}); err != nil {
			t.Fatal(err)
		}
	}
	var sawCQ, sawQP bool
	for !sawCQ || !sawQP {
		ev := nextEvent(t, pb.Ctx)
		switch {
		case ev.Type == verbs.EventCQErr && ev.CQ == small:
			sawCQ = true
		case ev.Type == verbs.EventQPFatal && ev.QP == qb:
			sawQP = true
		default:
			t.Fatalf("unexpected event %+v", ev)
		}
	}
	a, _, err := qb.Query(verbs.QPAttrState)
	if err != nil || a.State != verbs.QPSErr {
		t.Fatalf("QP after the overrun: %v %v", a.State, err)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	d, err := softhca.New(context.Background(), softhca.Config{Name: "metrics0",
		Addr: netip.MustParseAddr("127.9.7.1"), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Open(verbs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" {
					key += "/" + l.GetValue()
				}
				if l.GetName() == "device" && l.GetValue() != "metrics0" {
					t.Fatalf("metric %s labeled device %q", key, l.GetValue())
				}
			}
			found[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	if _, ok := found["xrc_softhca_port_xmit_packets_total"]; !ok {
		t.Fatalf("no port_xmit_packets metric in %v", found)
	}
	if found["xrc_softhca_objects/pd"] != 1 || found["xrc_softhca_objects/client"] != 1 {
		t.Fatalf("object gauges %v", found)
	}
	pd.Close()
	c.Close()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if mfs, _ := reg.Gather(); len(mfs) != 0 {
		t.Fatalf("metrics left after Close: %d families", len(mfs))
	}
}
