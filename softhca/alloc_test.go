package softhca_test

import (
	"testing"

	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// TestDataPathAllocs checks that a steady stream of SEND, RDMA WRITE and
// RDMA READ requests allocates nothing: not in PostSend, PostRecv or Poll,
// and not in the device's engine.
func TestDataPathAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector, which allocates itself")
	}
	env := verbstest.Env{Open: func(t testing.TB) (a, b *verbs.Context) {
		d := newDevice(t, nil)
		return open(t, d), open(t, d)
	}}
	pa, pb := verbstest.Connect(t, env, 1<<16)
	wc := make([]verbs.WorkCompletion, 4)
	recv := &verbs.RecvWR{SG: []verbs.SGE{pb.MR.SGE(0, 4096)}}
	send := &verbs.SendWR{Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{pa.MR.SGE(0, 3000)}}
	write := &verbs.SendWR{Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, SG: []verbs.SGE{pa.MR.SGE(0, 5000)},
		RemoteAddr: pb.MR.Addr(), RKey: pb.MR.RKey()}
	read := &verbs.SendWR{Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, SG: []verbs.SGE{pa.MR.SGE(8192, 5000)},
		RemoteAddr: pb.MR.Addr(), RKey: pb.MR.RKey()}
	wait := func(cq *verbs.CQ, n int) {
		for n > 0 {
			k, err := cq.Poll(wc)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range wc[:k] {
				if c.Status != verbs.WCSuccess {
					t.Fatalf("completion %+v", c)
				}
			}
			n -= k
		}
	}
	round := func() {
		if err := pb.QP.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
		for _, wr := range []*verbs.SendWR{send, write, read} {
			if err := pa.QP.PostSend(wr); err != nil {
				t.Fatal(err)
			}
		}
		wait(pa.CQ, 3)
		wait(pb.CQ, 1)
	}
	for range 200 { // warm the pools and slices up
		round()
	}
	if n := testing.AllocsPerRun(500, round); n > 0.05 {
		t.Fatalf("%.2f allocations per round of three requests", n)
	}
}
