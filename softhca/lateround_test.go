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
// stalled device from a lost packet. The test took the device for stopped
// once SIGSTOP was sent; on a loaded machine its threads may stop
// milliseconds later, and it answered the SEND at once (hcatest.Stop).
func TestLateRoundsCounted(t *testing.T) { lateRoundsCounted(t, 0) }

// TestLateRoundsCountedSlowSender: so it does when the sending device is
// itself held off the CPU for a while as the SEND is posted, as a loaded
// machine may do: the receiver's stop is timed from the SEND's leaving,
// not from its posting. The test resumed the receiver 50 ms after the
// post, which could be before the SEND left; the receiver then answered
// it at once and the test failed.
func TestLateRoundsCountedSlowSender(t *testing.T) { lateRoundsCounted(t, 100*time.Millisecond) }

// lateRoundsCounted runs the test, with the sending device's process
// stopped for senderStall as the SEND is posted.
func lateRoundsCounted(t *testing.T, senderStall time.Duration) {
	dir := t.TempDir()
	a, b := hcatest.Start(t, dir), hcatest.Start(t, dir)
	env := verbstest.Env{Name: "stopped", Open: func(t testing.TB) (x, y *verbs.Context) { return attach(t, a), attach(t, b) }}
	pa, pb := verbstest.Connect(t, env, 4096)
	stillTalk(t, pa, pb) // both devices are up and talking
	before, sentBefore := b.Counters(t), a.Counters(t)["port_xmit_packets"]

	if err := pb.QP.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{pb.MR.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	defer b.Signal(syscall.SIGCONT)
	b.Stop(t) // not only sent SIGSTOP: stopped
	if senderStall > 0 {
		defer a.Signal(syscall.SIGCONT)
		a.Stop(t)
		time.AfterFunc(senderStall, func() { a.Signal(syscall.SIGCONT) })
	}
	if err := pa.QP.PostSend(&verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{pa.MR.SGE(0, 10)}}); err != nil {
		t.Fatal(err)
	}
	// b's stop counts from when the SEND left a, however late a's
	// engine got to it.
	for deadline := time.Now().Add(10 * time.Second); a.Counters(t)["port_xmit_packets"] == sentBefore; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the SEND did not leave its device within 10 s")
		}
	}
	time.Sleep(50 * time.Millisecond)
	if err := b.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitWC(t, pa.CQ, 2)
	waitWC(t, pb.CQ, 1)
	// The device counts the round once its answers have left, and so
	// perhaps a moment after they completed the SEND: a read of the
	// counters may come before.
	m := b.Counters(t)
	for deadline := time.Now().Add(10 * time.Second); m["late_rounds"] == before["late_rounds"] && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		m = b.Counters(t)
	}
	n, ns := m["late_rounds"]-before["late_rounds"], time.Duration(m["late_round_ns"]-before["late_round_ns"])
	if n == 0 {
		t.Fatalf("the device answered a SEND after its process was stopped 50 ms and counted no late round within 10 s")
	}
	if ns < time.Duration(n)*10*time.Millisecond {
		t.Errorf("%d late rounds add up to %v: less than 10 ms each", n, ns)
	}
}
