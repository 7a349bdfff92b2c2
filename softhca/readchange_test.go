package softhca_test

import (
	"testing"

	"github.com/xrcrun/xrc/softhca/hcatest"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// TestReadOfChangingMemory reads memory that its owner keeps writing
// meanwhile, as a program reads a remote counter or ring index: every READ
// completes, with some mix of old and new bytes, and no response is
// dropped for a bad ICRC. (A device that computed a response's ICRC over
// the memory and let the kernel copy the memory later would send responses
// that do not match their ICRC.) The owner is this process and the devices
// are processes of their own, so that the race detector sees no race in
// what a hardware HCA does too.
func TestReadOfChangingMemory(t *testing.T) {
	dir := t.TempDir()
	a, b := hcatest.Start(t, dir), hcatest.Start(t, dir)
	env := verbstest.Env{Name: "changing", Open: func(t testing.TB) (x, y *verbs.Context) { return attach(t, a), attach(t, b) }}
	pa, pb := verbstest.ConnectWith(t, env, 1<<20, verbstest.Options{MTU: verbs.MTU4096})
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for off := i % 64; off < len(pb.Buf); off += 64 {
				pb.Buf[off]++
			}
		}
	}()
	for i := range 20 {
		wr := &verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{pa.MR.SGE(0, 1<<20)}, RemoteAddr: pb.MR.Addr(), RKey: pb.MR.RKey()}
		if err := pa.QP.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		waitWC(t, pa.CQ, uint64(i))
	}
	close(stop)
	<-done
	if n := a.Counters(t)["port_rcv_icrc_errors"]; n != 0 {
		t.Fatalf("%d READ responses dropped for a bad ICRC", n)
	}
}
