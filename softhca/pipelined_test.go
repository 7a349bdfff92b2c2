package softhca_test

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// TestLossyPipelined posts, again and again, a READ with a SEND, a WRITE, a
// fetch-and-add and another READ behind it, in one call, over links that
// lose 5% of the packets, duplicate 5% and reorder 5%; every third SEND
// finds its receive posted late (RNR NAKs). The acknowledgements and NAKs
// that wait for READ responses (responses go in PSN order) must neither
// get lost nor mislead the requester: everything completes, in order,
// with the right data. (After a reviewer's test.)
func TestLossyPipelined(t *testing.T) {
	env, devs := lossyEnv(softhca.Faults{Loss: 0.05, Duplicate: 0.05, Reorder: 0.05, Seed: 11}, false)
	pa, pb := verbstest.ConnectWith(t, env, 4<<20, verbstest.Options{})
	rng := rand.New(rand.NewPCG(1, 2))
	const (
		counter = 1 << 20 // pb's fetch-and-add target
		sendBuf = 3 << 20 // pa's SEND and WRITE data, then its fetch-and-add result
		landing = 2 << 20 // where pb receives the SEND, and the WRITE 128 bytes on
	)
	for i := range pb.Buf[:counter] {
		pb.Buf[i] = byte(i*7 + 3)
	}
	wc := make([]verbs.WorkCompletion, 16)
	postRecv := func(id int) {
		if err := pb.QP.PostRecv(&verbs.RecvWR{WRID: uint64(id), SG: []verbs.SGE{pb.MR.SGE(landing, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	for it := range 24 {
		size := 1 + rng.IntN(256<<10)
		late := it%3 == 0
		if !late {
			postRecv(it)
		}
		clear(pa.Buf[:size+4096])
		clear(pb.Buf[landing : landing+256])
		msg := []byte("message " + string(rune('a'+it)))
		copy(pa.Buf[sendBuf:], msg)
		base := uint64(it * 10)
		wrs := []*verbs.SendWR{
			{WRID: base + 1, Opcode: verbs.WRRDMARead, SG: []verbs.SGE{pa.MR.SGE(0, size)}, RemoteAddr: pb.MR.Addr(), RKey: pb.MR.RKey()},
			{WRID: base + 2, Opcode: verbs.WRSend, SG: []verbs.SGE{pa.MR.SGE(sendBuf, len(msg))}},
			{WRID: base + 3, Opcode: verbs.WRRDMAWrite, SG: []verbs.SGE{pa.MR.SGE(sendBuf, len(msg))}, RemoteAddr: pb.MR.Addr() + landing + 128, RKey: pb.MR.RKey()},
			{WRID: base + 4, Opcode: verbs.WRAtomicFetchAdd, SG: []verbs.SGE{pa.MR.SGE(sendBuf+256, 8)}, RemoteAddr: pb.MR.Addr() + counter, RKey: pb.MR.RKey(), CompareAdd: 1},
			{WRID: base + 5, Opcode: verbs.WRRDMARead, SG: []verbs.SGE{pa.MR.SGE(size, 4096)}, RemoteAddr: pb.MR.Addr() + 4096, RKey: pb.MR.RKey()},
		}
		postChain(t, pa.QP, wrs)
		if late {
			time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
			postRecv(it)
		}
		for got, deadline := 0, time.Now().Add(30*time.Second); got < len(wrs); {
			k, err := pa.CQ.Poll(wc)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range wc[:k] {
				if c.Status != verbs.WCSuccess || c.WRID != base+uint64(got+1) {
					t.Fatalf("round %d: completion %+v, want wr %d done", it, c, base+uint64(got+1))
				}
				got++
			}
			if k == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("round %d: %d of %d completions", it, got, len(wrs))
				}
				time.Sleep(20 * time.Microsecond)
			}
		}
		waitWC(t, pb.CQ, uint64(it))
		if !bytes.Equal(pa.Buf[:size], pb.Buf[:size]) || !bytes.Equal(pa.Buf[size:size+4096], pb.Buf[4096:8192]) {
			t.Fatalf("round %d: READ data differ", it)
		}
		if got := binary.NativeEndian.Uint64(pa.Buf[sendBuf+256:]); got != uint64(it) {
			t.Fatalf("round %d: fetch-and-add returned %d, want %d", it, got, it)
		}
		if !bytes.Equal(pb.Buf[landing:landing+len(msg)], msg) || !bytes.Equal(pb.Buf[landing+128:landing+128+len(msg)], msg) {
			t.Fatalf("round %d: SEND and WRITE landed as %q and %q", it, pb.Buf[landing:landing+len(msg)], pb.Buf[landing+128:landing+128+len(msg)])
		}
	}
	if got := binary.NativeEndian.Uint64(pb.Buf[counter:]); got != 24 {
		t.Fatalf("counter %d after 24 fetch-and-adds", got)
	}
	for i, d := range devs {
		c := d.Counters()
		if c.FaultDrops.Load() == 0 {
			t.Errorf("device %d dropped nothing", i)
		}
		t.Logf("device %d: %d dropped, %d retransmitted, %d duplicate requests, %d sequence NAKs, %d implied NAKs, %d RNR NAKs sent, %d timeouts",
			i, c.FaultDrops.Load(), c.Retransmits.Load(), c.DuplicateRequest.Load(), c.PacketSeqErr.Load(), c.ImpliedNakSeqErr.Load(), c.RNRNaksSent.Load(), c.AckTimeouts.Load())
	}
}
