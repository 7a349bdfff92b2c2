package softhca_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca/hcatest"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// TestLateRoundsCounted stops a device's process while a SEND is on its
// way to it: when it runs again, it answers the SEND late, and counts the
// round that did (late_rounds), which is how the lossless tests tell a
// stalled device from a lost packet.
func TestLateRoundsCounted(t *testing.T) {
	dir := t.TempDir()
	a, b := hcatest.Start(t, dir), hcatest.Start(t, dir)
	env := verbstest.Env{Name: "stopped", Open: func(t testing.TB) (x, y *verbs.Context) { return attach(t, a), attach(t, b) }}
	pa, pb := verbstest.Connect(t, env, 4096)
	stillTalk(t, pa, pb) // both devices are up and talking
	before := b.Counters(t)

	if err := pb.QP.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{pb.MR.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := pa.QP.PostSend(&verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{pa.MR.SGE(0, 10)}}); err != nil {
		b.Signal(syscall.SIGCONT)
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := b.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitWC(t, pa.CQ, 2)
	waitWC(t, pb.CQ, 1)
	m := b.Counters(t)
	n, ns := m["late_rounds"]-before["late_rounds"], time.Duration(m["late_round_ns"]-before["late_round_ns"])
	if n == 0 {
		t.Fatalf("the device answered a SEND after its process was stopped 50 ms and counted no late round")
	}
	if ns < time.Duration(n)*10*time.Millisecond {
		t.Errorf("%d late rounds add up to %v: less than 10 ms each", n, ns)
	}
}
