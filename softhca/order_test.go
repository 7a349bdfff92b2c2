package softhca_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// TestResponsesInRequestOrder posts an RDMA READ and, behind it on the
// same QP, a SEND, a WRITE and a fetch-and-add. The responder sends the
// READ's responses over several rounds; the acknowledgement of the later
// requests and the atomic's response must follow them, not overtake them:
// a requester that sees them first takes the READ's responses for lost (an
// implied NAK) and asks for them again. On a lossless link nothing may be
// asked for twice. The same holds for an RNR NAK of a SEND behind a READ.
// (A long WRITE first opens the send window wide enough for the requests
// behind the READ to go at once.)
func TestResponsesInRequestOrder(t *testing.T) {
	f := softhca.NewFabric()
	da, db := newDevice(t, f), newDevice(t, f)
	env := verbstest.Env{Name: "order", Open: func(t testing.TB) (a, b *verbs.Context) { return open(t, da), open(t, db) }}
	const size = 256 << 10 // 256 responses at MTU 1024, 64 a round
	// A transport timeout of 4 s: no timeout may retransmit on a slow machine.
	pa, pb := verbstest.ConnectWith(t, env, 4<<20, verbstest.Options{Timeout: 20})
	warm := &verbs.SendWR{WRID: 9, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{pa.MR.SGE(0, 2<<20)}, RemoteAddr: pb.MR.Addr() + 2<<20, RKey: pb.MR.RKey()}
	if err := pa.QP.PostSend(warm); err != nil {
		t.Fatal(err)
	}
	waitWC(t, pa.CQ, 9)
	for i := range pb.Buf[:size] {
		pb.Buf[i] = byte(i*13 + 5)
	}
	binary.NativeEndian.PutUint64(pb.Buf[size:], 40)
	if err := pb.QP.PostRecv(&verbs.RecvWR{WRID: 100, SG: []verbs.SGE{pb.MR.SGE(size+64, 64)}}); err != nil {
		t.Fatal(err)
	}
	copy(pa.Buf[size:], "send and write")
	raddr := pb.MR.Addr()
	wrs := []*verbs.SendWR{
		{WRID: 1, Opcode: verbs.WRRDMARead, SG: []verbs.SGE{pa.MR.SGE(0, size)}, RemoteAddr: raddr, RKey: pb.MR.RKey()},
		{WRID: 2, Opcode: verbs.WRSend, SG: []verbs.SGE{pa.MR.SGE(size, 14)}},
		{WRID: 3, Opcode: verbs.WRRDMAWrite, SG: []verbs.SGE{pa.MR.SGE(size, 14)}, RemoteAddr: raddr + size + 128, RKey: pb.MR.RKey()},
		{WRID: 4, Opcode: verbs.WRAtomicFetchAdd, SG: []verbs.SGE{pa.MR.SGE(size+256, 8)}, RemoteAddr: raddr + size, RKey: pb.MR.RKey(), CompareAdd: 2},
	}
	postChain(t, pa.QP, wrs) // one post: the device takes all four at once
	for _, id := range []uint64{1, 2, 3, 4} {
		waitWC(t, pa.CQ, id)
	}
	waitWC(t, pb.CQ, 100)
	if !bytes.Equal(pa.Buf[:size], pb.Buf[:size]) {
		t.Error("the READ brought other bytes")
	}
	if got := binary.NativeEndian.Uint64(pa.Buf[size+256:]); got != 40 {
		t.Errorf("fetch-and-add returned %d, want 40", got)
	}
	if string(pb.Buf[size+64:size+78]) != "send and write" || string(pb.Buf[size+128:size+142]) != "send and write" {
		t.Errorf("SEND and WRITE landed as %q and %q", pb.Buf[size+64:size+78], pb.Buf[size+128:size+142])
	}
	ca, cb := da.Counters(), db.Counters()
	if n := ca.ImpliedNakSeqErr.Load() + ca.PacketSeqErr.Load() + ca.Retransmits.Load() + ca.RcvErrors.Load(); n != 0 {
		t.Errorf("requester: %d implied NAKs, %d sequence errors, %d retransmissions, %d receive errors",
			ca.ImpliedNakSeqErr.Load(), ca.PacketSeqErr.Load(), ca.Retransmits.Load(), ca.RcvErrors.Load())
	}
	if n := cb.DuplicateRequest.Load(); n != 0 {
		t.Errorf("responder: %d duplicate requests", n)
	}

	// A SEND with no receive posted behind a READ: its RNR NAK follows
	// the READ's responses too. The receive comes once the READ is done.
	wrs[0].WRID, wrs[1].WRID = 11, 12
	postChain(t, pa.QP, wrs[:2])
	waitWC(t, pa.CQ, 11)
	if err := pb.QP.PostRecv(&verbs.RecvWR{WRID: 101, SG: []verbs.SGE{pb.MR.SGE(size+64, 64)}}); err != nil {
		t.Fatal(err)
	}
	waitWC(t, pa.CQ, 12)
	waitWC(t, pb.CQ, 101)
	if ca.RNRNaksReceived.Load() == 0 {
		t.Error("the SEND got no RNR NAK")
	}
	if n := ca.ImpliedNakSeqErr.Load() + ca.PacketSeqErr.Load() + ca.RcvErrors.Load() + cb.DuplicateRequest.Load(); n != 0 {
		t.Errorf("with an RNR NAK: %d implied NAKs, %d sequence errors, %d receive errors; %d duplicate requests",
			ca.ImpliedNakSeqErr.Load(), ca.PacketSeqErr.Load(), ca.RcvErrors.Load(), cb.DuplicateRequest.Load())
	}
}

// postChain posts wrs, signaled, with one call: the device takes them all
// at once.
func postChain(t *testing.T, qp *verbs.QP, wrs []*verbs.SendWR) {
	t.Helper()
	for i, wr := range wrs {
		wr.Flags, wr.Next = verbs.SendSignaled, nil
		if i > 0 {
			wrs[i-1].Next = wr
		}
	}
	if err := qp.PostSend(wrs[0]); err != nil {
		t.Fatal(err)
	}
}
