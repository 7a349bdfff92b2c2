package verbstest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/verbs"
)

// Run runs the conformance suite on env.
func Run(t *testing.T, env Env) {
	tests := []struct {
		name string
		fn   func(*testing.T, Env)
	}{
		{"Device", testDevice},
		{"SendRecv", testSendRecv},
		{"SendWithImm", testSendWithImm},
		{"LargeMessages", testLargeMessages},
		{"RDMAWrite", testRDMAWrite},
		{"RDMAWriteWithImm", testRDMAWriteWithImm},
		{"RDMARead", testRDMARead},
		{"Atomics", testAtomics},
		{"Unsignaled", testUnsignaled},
		{"Inline", testInline},
		{"MultipleSGEs", testMultipleSGEs},
		{"GoMemory", testGoMemory},
		{"SRQ", testSRQ},
		{"SRQLimitEvent", testSRQLimitEvent},
		{"CompletionChannel", testCompletionChannel},
		{"TryEvent", testTryEvent},
		{"BadLKey", testBadLKey},
		{"MissingRemoteAccess", testMissingRemoteAccess},
		{"BadRKey", testBadRKey},
		{"RecvTooSmall", testRecvTooSmall},
		{"FlushOnError", testFlushOnError},
		{"Transitions", testTransitions},
		{"SQDrain", testSQDrain},
		{"Busy", testBusy},
		{"ClosedObjects", testClosedObjects},
		{"RNRRetryExceeded", testRNRRetryExceeded},
		{"RNRRecovers", testRNRRecovers},
		{"RetryExceeded", testRetryExceeded},
		{"WriteImmRNR", testWriteImmRNR},
		{"CompletionOrderOnError", testCompletionOrderOnError},
		{"ResetAndReconnect", testResetAndReconnect},
		{"PSNWrap", testPSNWrap},
		{"RecvPostedInError", testRecvPostedInError},
		{"XRC", testXRC},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, env) })
	}
}

func testDevice(t *testing.T, env Env) {
	a, _ := env.Open(t)
	attr, err := a.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	if attr.MaxQP == 0 || attr.MaxCQE == 0 || attr.MaxSGE == 0 || attr.PhysPortCnt == 0 {
		t.Fatalf("implausible device attributes %+v", attr)
	}
	port, err := a.QueryPort(1)
	if err != nil {
		t.Fatal(err)
	}
	if port.State != verbs.PortActive || port.ActiveMTU.Bytes() == 0 {
		t.Fatalf("port %+v", port)
	}
	if _, err := a.QueryPort(attr.PhysPortCnt + 1); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("query of a port the device lacks: %v, want EINVAL", err)
	}
}

// sendRecv sends n bytes from a's buffer to b's and checks them.
func sendRecv(t *testing.T, p *pair, n int, seed byte) {
	t.Helper()
	fill(p.a.buf[:n], seed)
	clear(p.b.buf[:n+64])
	if err := p.b.qp.PostRecv(&verbs.RecvWR{WRID: 100, SG: []verbs.SGE{p.b.mr.SGE(0, n+64)}}); err != nil {
		t.Fatal(err)
	}
	if err := p.a.qp.PostSend(&verbs.SendWR{WRID: 200, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(0, n)}}); err != nil {
		t.Fatal(err)
	}
	wc := pollOne(t, p.b.cq, verbs.WCSuccess, 100)
	if wc.Opcode != verbs.WCRecv || wc.ByteLen != uint32(n) || wc.SrcQP != p.a.qp.Num() || wc.QPNum != p.b.qp.Num() {
		t.Fatalf("receive completion %+v", wc)
	}
	if wc.Flags&verbs.WCWithImm != 0 {
		t.Fatalf("receive completion has immediate data: %+v", wc)
	}
	wc = pollOne(t, p.a.cq, verbs.WCSuccess, 200)
	if wc.Opcode != verbs.WCSend {
		t.Fatalf("send completion %+v", wc)
	}
	if !bytes.Equal(p.a.buf[:n], p.b.buf[:n]) {
		t.Fatalf("%d bytes: data differs", n)
	}
	if !bytes.Equal(p.b.buf[n:n+64], make([]byte, 64)) {
		t.Fatalf("%d bytes: wrote past the message", n)
	}
}

func testSendRecv(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	for i, n := range []int{0, 1, 8, 1000, 1024, 1025, 4096, 65536, 300000} {
		sendRecv(t, p, n, byte(i))
	}
}

// testLargeMessages moves messages of many MTUs, more than any send window
// holds, with each operation.
func testLargeMessages(t *testing.T, env Env) {
	o := defaultOpts()
	o.bufSize = 8 << 20
	p := newPair(t, env, o)
	const n = 3<<20 + 77
	sendRecv(t, p, n, 42)
	fill(p.a.buf[:n], 43)
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(0, n)}, RemoteAddr: p.b.mr.Addr() + 4<<20, RKey: p.b.mr.RKey()}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 1)
	if !bytes.Equal(p.b.buf[4<<20:4<<20+n], p.a.buf[:n]) {
		t.Fatal("large write: data differs")
	}
	fill(p.b.buf[:n], 44)
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 2, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(4<<20, n)}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 2)
	if !bytes.Equal(p.a.buf[4<<20:4<<20+n], p.b.buf[:n]) {
		t.Fatal("large read: data differs")
	}
}

func testSendWithImm(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	fill(p.a.buf[:3000], 3)
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{p.b.mr.SGE(0, 4096)}}))
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 2, Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled,
		Imm: 0xdeadbeef, SG: []verbs.SGE{p.a.mr.SGE(0, 3000)}}))
	wc := pollOne(t, p.b.cq, verbs.WCSuccess, 1)
	if wc.Opcode != verbs.WCRecv || wc.Flags&verbs.WCWithImm == 0 || wc.Imm != 0xdeadbeef || wc.ByteLen != 3000 {
		t.Fatalf("receive completion %+v", wc)
	}
	pollOne(t, p.a.cq, verbs.WCSuccess, 2)
	if !bytes.Equal(p.a.buf[:3000], p.b.buf[:3000]) {
		t.Fatal("data differs")
	}
}

func testRDMAWrite(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	for i, n := range []int{1, 64, 1024, 5000, 1 << 18} {
		off := 4096 + i*13
		fill(p.a.buf[:n], byte(i+1))
		clear(p.b.buf)
		check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{p.a.mr.SGE(0, n)}, RemoteAddr: p.b.mr.Addr() + uint64(off), RKey: p.b.mr.RKey()}))
		wc := pollOne(t, p.a.cq, verbs.WCSuccess, uint64(i))
		if wc.Opcode != verbs.WCRDMAWrite {
			t.Fatalf("completion %+v", wc)
		}
		if !bytes.Equal(p.b.buf[off:off+n], p.a.buf[:n]) {
			t.Fatalf("%d bytes: data differs", n)
		}
		if p.b.buf[off-1] != 0 || p.b.buf[off+n] != 0 {
			t.Fatalf("%d bytes: wrote outside the target", n)
		}
	}
	noCompletion(t, p.b.cq, 5*time.Millisecond) // a plain write consumes no receive
}

func testRDMAWriteWithImm(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	n := 2500
	fill(p.a.buf[:n], 9)
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 5}))
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 6, Opcode: verbs.WRRDMAWriteWithImm, Flags: verbs.SendSignaled,
		Imm: 0x01020304, SG: []verbs.SGE{p.a.mr.SGE(0, n)}, RemoteAddr: p.b.mr.Addr() + 100, RKey: p.b.mr.RKey()}))
	wc := pollOne(t, p.b.cq, verbs.WCSuccess, 5)
	if wc.Opcode != verbs.WCRecvRDMAWithImm || wc.Flags&verbs.WCWithImm == 0 || wc.Imm != 0x01020304 || wc.ByteLen != uint32(n) {
		t.Fatalf("receive completion %+v", wc)
	}
	pollOne(t, p.a.cq, verbs.WCSuccess, 6)
	if !bytes.Equal(p.b.buf[100:100+n], p.a.buf[:n]) {
		t.Fatal("data differs")
	}
}

func testRDMARead(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	for i, n := range []int{0, 1, 1024, 1025, 70000} {
		fill(p.b.buf[:n], byte(i+20))
		clear(p.a.buf)
		check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{p.a.mr.SGE(8, n)}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}))
		wc := pollOne(t, p.a.cq, verbs.WCSuccess, uint64(i))
		if wc.Opcode != verbs.WCRDMARead || wc.ByteLen != uint32(n) {
			t.Fatalf("completion %+v", wc)
		}
		if !bytes.Equal(p.a.buf[8:8+n], p.b.buf[:n]) {
			t.Fatalf("%d bytes: data differs", n)
		}
	}
}

func testAtomics(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	target := p.b.buf[64:72]
	binary.NativeEndian.PutUint64(target, 1000)
	raddr := p.b.mr.Addr() + 64
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRAtomicFetchAdd, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(0, 8)}, RemoteAddr: raddr, RKey: p.b.mr.RKey(), CompareAdd: 42}))
	wc := pollOne(t, p.a.cq, verbs.WCSuccess, 1)
	if wc.Opcode != verbs.WCFetchAdd || wc.ByteLen != 8 {
		t.Fatalf("completion %+v", wc)
	}
	if got := binary.NativeEndian.Uint64(p.a.buf[:8]); got != 1000 {
		t.Fatalf("fetch-add returned %d, want 1000", got)
	}
	if got := binary.NativeEndian.Uint64(target); got != 1042 {
		t.Fatalf("after fetch-add memory holds %d, want 1042", got)
	}
	// A compare that fails leaves memory alone; one that matches swaps.
	for i, c := range []struct{ compare, swap, orig, after uint64 }{
		{compare: 1, swap: 7, orig: 1042, after: 1042},
		{compare: 1042, swap: 7, orig: 1042, after: 7},
	} {
		check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: uint64(10 + i), Opcode: verbs.WRAtomicCmpAndSwp, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{p.a.mr.SGE(16, 8)}, RemoteAddr: raddr, RKey: p.b.mr.RKey(), CompareAdd: c.compare, Swap: c.swap}))
		wc := pollOne(t, p.a.cq, verbs.WCSuccess, uint64(10+i))
		if wc.Opcode != verbs.WCCompSwap {
			t.Fatalf("completion %+v", wc)
		}
		if got := binary.NativeEndian.Uint64(p.a.buf[16:24]); got != c.orig {
			t.Fatalf("cmp-swap %d: returned %d, want %d", i, got, c.orig)
		}
		if got := binary.NativeEndian.Uint64(target); got != c.after {
			t.Fatalf("cmp-swap %d: memory holds %d, want %d", i, got, c.after)
		}
	}
}

func testUnsignaled(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	const n = 10
	for i := range n {
		p.a.buf[i] = byte(0x50 + i)
		check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: uint64(i), SG: []verbs.SGE{p.b.mr.SGE(i*16, 16)}}))
	}
	for i := range n {
		wr := &verbs.SendWR{WRID: uint64(100 + i), Opcode: verbs.WRSend, SG: []verbs.SGE{p.a.mr.SGE(i, 1)}}
		if i == n-1 {
			wr.Flags = verbs.SendSignaled
		}
		check(t, p.a.qp.PostSend(wr))
	}
	wcs := poll(t, p.b.cq, n)
	for i, wc := range wcs {
		if wc.Status != verbs.WCSuccess || wc.WRID != uint64(i) || p.b.buf[i*16] != byte(0x50+i) {
			t.Fatalf("receive %d: %+v", i, wc)
		}
	}
	pollOne(t, p.a.cq, verbs.WCSuccess, 100+n-1)
	noCompletion(t, p.a.cq, 5*time.Millisecond) // only the signaled request completes
	// The queue's slots came back: many more unsignaled requests fit.
	for round := range 3 {
		for i := range 60 {
			check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: uint64(i), SG: []verbs.SGE{p.b.mr.SGE(0, 16)}}))
			wr := &verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSend, SG: []verbs.SGE{p.a.mr.SGE(0, 1)}}
			if i == 59 {
				wr.Flags = verbs.SendSignaled
			}
			if err := p.a.qp.PostSend(wr); err != nil {
				t.Fatalf("round %d request %d: %v", round, i, err)
			}
		}
		poll(t, p.b.cq, 60)
		pollOne(t, p.a.cq, verbs.WCSuccess, 59)
	}
}

func testInline(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	for _, n := range []int{1, 20, 60, 100, 128} {
		fill(p.a.buf[:n], byte(n))
		want := append([]byte(nil), p.a.buf[:n]...)
		check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{p.b.mr.SGE(0, 256)}}))
		// Inline data is copied at post time: the buffer, and even its key,
		// do not matter afterwards.
		sg := p.a.mr.SGE(0, n)
		sg.LKey = 0
		check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled | verbs.SendInline,
			SG: []verbs.SGE{sg}}))
		clear(p.a.buf[:n])
		wc := pollOne(t, p.b.cq, verbs.WCSuccess, 1)
		pollOne(t, p.a.cq, verbs.WCSuccess, 2)
		if wc.ByteLen != uint32(n) || !bytes.Equal(p.b.buf[:n], want) {
			t.Fatalf("%d inline bytes: got %d bytes %x", n, wc.ByteLen, p.b.buf[:wc.ByteLen])
		}
	}
	// Inline over two SGEs, and an RDMA WRITE.
	fill(p.a.buf[:200], 77)
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled | verbs.SendInline,
		SG: []verbs.SGE{p.a.mr.SGE(0, 50), p.a.mr.SGE(100, 70)}, RemoteAddr: p.b.mr.Addr() + 1000, RKey: p.b.mr.RKey()}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 3)
	if !bytes.Equal(p.b.buf[1000:1050], p.a.buf[:50]) || !bytes.Equal(p.b.buf[1050:1120], p.a.buf[100:170]) {
		t.Fatal("inline write with two SGEs: data differs")
	}
	// More than the QP takes inline is refused at post time.
	err := p.a.qp.PostSend(&verbs.SendWR{WRID: 4, Opcode: verbs.WRSend, Flags: verbs.SendInline,
		SG: []verbs.SGE{p.a.mr.SGE(0, int(p.a.qp.Cap().MaxInlineData)+1)}})
	var perr *verbs.PostError
	if !errors.As(err, &perr) || perr.Index != 0 {
		t.Fatalf("oversized inline post: %v", err)
	}
}

func testMultipleSGEs(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	fill(p.a.buf[:9000], 5)
	src := []verbs.SGE{p.a.mr.SGE(0, 100), p.a.mr.SGE(5000, 3000), p.a.mr.SGE(200, 7)}
	want := append(append(append([]byte(nil), p.a.buf[0:100]...), p.a.buf[5000:8000]...), p.a.buf[200:207]...)
	dst := []verbs.SGE{p.b.mr.SGE(10000, 50), p.b.mr.SGE(20000, 1000), p.b.mr.SGE(30000, 4000)}
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 1, SG: dst}))
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: src}))
	wc := pollOne(t, p.b.cq, verbs.WCSuccess, 1)
	pollOne(t, p.a.cq, verbs.WCSuccess, 2)
	if wc.ByteLen != uint32(len(want)) {
		t.Fatalf("received %d bytes, want %d", wc.ByteLen, len(want))
	}
	got := append(append(append([]byte(nil), p.b.buf[10000:10050]...), p.b.buf[20000:21000]...), p.b.buf[30000:30000+len(want)-1050]...)
	if !bytes.Equal(got, want) {
		t.Fatal("scattered data differs")
	}
	// RDMA READ into several SGEs.
	fill(p.b.buf[:600], 33)
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(100000, 100), p.a.mr.SGE(200000, 500)}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 3)
	if !bytes.Equal(p.a.buf[100000:100100], p.b.buf[:100]) || !bytes.Equal(p.a.buf[200000:200500], p.b.buf[100:600]) {
		t.Fatal("read into two SGEs: data differs")
	}
}

func testGoMemory(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	src := make([]byte, 5000)
	fill(src, 99)
	mr, err := p.a.pd.RegMR(src, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Close()
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{p.b.mr.SGE(0, 8192)}}))
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{mr.SGE(0, len(src))}}))
	pollOne(t, p.b.cq, verbs.WCSuccess, 1)
	pollOne(t, p.a.cq, verbs.WCSuccess, 2)
	if !bytes.Equal(p.b.buf[:len(src)], src) {
		t.Fatal("data from Go memory differs")
	}

	// A SEND gathered from three pieces of Go memory out of order, two of
	// whose five packets take bytes of two pieces.
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 5, SG: []verbs.SGE{p.b.mr.SGE(0, 8192)}}))
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 6, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{mr.SGE(3500, 1500), mr.SGE(100, 2500), mr.SGE(2600, 900)}}))
	pollOne(t, p.b.cq, verbs.WCSuccess, 5)
	pollOne(t, p.a.cq, verbs.WCSuccess, 6)
	if want := slices.Concat(src[3500:5000], src[100:2600], src[2600:3500]); !bytes.Equal(p.b.buf[:len(want)], want) {
		t.Fatal("data gathered from Go memory differs")
	}

	// An RDMA READ of Go memory: the responder reads it where it lies (for
	// a device in another process, through the client's address space),
	// in more packets (98 at MTU 1024) than the device sends in one go.
	remote := make([]byte, 100000)
	fill(remote, 41)
	rmr, err := p.b.pd.RegMR(remote, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	defer rmr.Close()
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(8192, len(remote))}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 3)
	if !bytes.Equal(p.a.buf[8192:8192+len(remote)], remote) {
		t.Fatal("data read from Go memory differs")
	}

	// And an RDMA READ into Go memory, scattered over three pieces out of
	// order, so that packets fall on both sides of their edges.
	dst := make([]byte, 200000)
	dmr, err := p.a.pd.RegMR(dst, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer dmr.Close()
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 4, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SG:         []verbs.SGE{dmr.SGE(100000, 30000), dmr.SGE(0, 50000), dmr.SGE(150000, 20000)},
		RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 4)
	got := slices.Concat(dst[100000:130000], dst[:50000], dst[150000:170000])
	if !bytes.Equal(got, remote) {
		t.Fatal("data read into Go memory differs")
	}
	for _, gap := range [][2]int{{50000, 100000}, {130000, 150000}, {170000, 200000}} {
		if !bytes.Equal(dst[gap[0]:gap[1]], make([]byte, gap[1]-gap[0])) {
			t.Fatalf("a READ wrote outside its scatter list, in [%d, %d)", gap[0], gap[1])
		}
	}
}

func testSRQ(t *testing.T, env Env) {
	o := defaultOpts()
	o.srq = true
	p := newPair(t, env, o)
	// A second QP on the same SRQ.
	a2 := newSide(t, p.a.ctx, o, nil)
	a2.createQP(o, nil)
	b2 := &side{t: t, ctx: p.b.ctx, port: p.b.port, pd: p.b.pd, cq: p.b.cq, buf: p.b.buf, mr: p.b.mr}
	b2.createQP(o, p.srq)
	connect(t, a2, b2, o)
	connect(t, b2, a2, o)
	for i := range 8 {
		check(t, p.srq.PostRecv(&verbs.RecvWR{WRID: uint64(1000 + i), SG: []verbs.SGE{p.b.mr.SGE(i*4096, 4096)}}))
	}
	if err := p.b.qp.PostRecv(&verbs.RecvWR{WRID: 1}); err == nil {
		t.Fatal("posting a receive to a QP on an SRQ succeeded")
	}
	fill(p.a.buf[:2000], 1)
	fill(a2.buf[:2000], 2)
	for i := range 4 {
		check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{p.a.mr.SGE(0, 1000+i)}}))
		check(t, a2.qp.PostSend(&verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{a2.mr.SGE(0, 1500+i)}}))
	}
	seen := map[uint64]bool{}
	for _, wc := range poll(t, p.b.cq, 8) {
		if wc.Status != verbs.WCSuccess || wc.WRID < 1000 || wc.WRID >= 1008 || seen[wc.WRID] {
			t.Fatalf("srq completion %+v", wc)
		}
		seen[wc.WRID] = true
		slot := p.b.buf[(wc.WRID-1000)*4096:]
		var src []byte
		switch wc.QPNum {
		case p.b.qp.Num():
			src = p.a.buf
		case b2.qp.Num():
			src = a2.buf
		default:
			t.Fatalf("completion for unknown QP %+v", wc)
		}
		if !bytes.Equal(slot[:wc.ByteLen], src[:wc.ByteLen]) {
			t.Fatalf("srq receive %d: data differs", wc.WRID)
		}
	}
	poll(t, p.a.cq, 4)
	poll(t, a2.cq, 4)
	attr, err := p.srq.Query()
	if err != nil || attr.MaxWR < 64 || attr.MaxSGE != 4 {
		t.Fatalf("srq query %+v, %v", attr, err)
	}
	// SRQs here do not resize: the feature probe says so.
	if err := p.b.ctx.Supports(verbs.FeatureSRQResize); err == nil {
		check(t, p.srq.Modify(verbs.SRQAttr{MaxWR: 100}, verbs.SRQMaxWR))
	} else if !errors.Is(p.srq.Modify(verbs.SRQAttr{MaxWR: 100}, verbs.SRQMaxWR), verbs.ErrNotSupported) {
		t.Fatal("resizing an SRQ without the capability does not say ErrNotSupported")
	}
}

func testSRQLimitEvent(t *testing.T, env Env) {
	o := defaultOpts()
	o.srq = true
	p := newPair(t, env, o)
	for i := range 4 {
		check(t, p.srq.PostRecv(&verbs.RecvWR{WRID: uint64(i), SG: []verbs.SGE{p.b.mr.SGE(i*64, 64)}}))
	}
	check(t, p.srq.Modify(verbs.SRQAttr{SRQLimit: 3}, verbs.SRQLimit))
	attr, err := p.srq.Query()
	if err != nil || attr.SRQLimit != 3 {
		t.Fatalf("srq limit %+v, %v", attr, err)
	}
	for i := range 2 {
		check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{p.a.mr.SGE(0, 10)}}))
	}
	poll(t, p.b.cq, 2)
	ev := waitAsync(t, p.b.ctx, verbs.EventSRQLimitReached)
	if ev.SRQ != p.srq {
		t.Fatalf("event %+v names another SRQ", ev)
	}
	// The limit disarms when it fires.
	attr, _ = p.srq.Query()
	if attr.SRQLimit != 0 {
		t.Fatalf("srq limit %d after the event, want 0", attr.SRQLimit)
	}
}

func testCompletionChannel(t *testing.T, env Env) {
	o := defaultOpts()
	o.channel = true
	p := newPair(t, env, o)
	ctx, cancel := context.WithTimeout(context.Background(), PollTimeout)
	defer cancel()
	// Nothing happens: the wait ends with the context.
	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err := p.ch[1].GetEvent(short)
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait with nothing to wait for: %v", err)
	}
	for round := range 3 {
		check(t, p.b.cq.RequestNotify(false))
		check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: uint64(round), SG: []verbs.SGE{p.b.mr.SGE(0, 64)}}))
		check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{p.a.mr.SGE(0, 8)}}))
		cq, err := p.ch[1].GetEvent(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if cq != p.b.cq {
			t.Fatal("event for another CQ")
		}
		pollOne(t, p.b.cq, verbs.WCSuccess, uint64(round))
		pollOne(t, p.a.cq, verbs.WCSuccess, 1)
	}
	// Unarmed, a completion raises no event.
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 9, SG: []verbs.SGE{p.b.mr.SGE(0, 64)}}))
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{p.a.mr.SGE(0, 8)}}))
	pollOne(t, p.b.cq, verbs.WCSuccess, 9)
	pollOne(t, p.a.cq, verbs.WCSuccess, 1)
	short, cancelShort = context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancelShort()
	if _, err := p.ch[1].GetEvent(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("event without arming: %v", err)
	}
	// Arming with a completion already there fires at once.
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 10, SG: []verbs.SGE{p.b.mr.SGE(0, 64)}}))
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{p.a.mr.SGE(0, 8)}}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 1)
	time.Sleep(time.Millisecond)
	check(t, p.b.cq.RequestNotify(false))
	if _, err := p.ch[1].GetEvent(ctx); err != nil {
		t.Fatal(err)
	}
	pollOne(t, p.b.cq, verbs.WCSuccess, 10)
}

func testBadLKey(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	sg := p.a.mr.SGE(0, 16)
	sg.LKey ^= 0x5500
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{p.b.mr.SGE(0, 64)}}))
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 7, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{sg}}))
	pollOne(t, p.a.cq, verbs.WCLocProtErr, 7)
	waitState(t, p.a.qp, verbs.QPSErr)
	// Out of the region's bounds is a protection error too.
	q := newPair(t, env, defaultOpts())
	sg = q.a.mr.SGE(len(q.a.buf)-8, 16)
	check(t, q.a.qp.PostSend(&verbs.SendWR{WRID: 8, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, SG: []verbs.SGE{sg},
		RemoteAddr: q.b.mr.Addr(), RKey: q.b.mr.RKey()}))
	pollOne(t, q.a.cq, verbs.WCLocProtErr, 8)
}

func testMissingRemoteAccess(t *testing.T, env Env) {
	o := defaultOpts()
	o.mrAccess = verbs.AccessLocalWrite // no remote access on the target region
	p := newPair(t, env, o)
	fill(p.a.buf[:64], 1)
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(0, 64)}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}))
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 4, Opcode: verbs.WRSend, SG: []verbs.SGE{p.a.mr.SGE(0, 8)}}))
	pollOne(t, p.a.cq, verbs.WCRemAccessErr, 3)
	pollOne(t, p.a.cq, verbs.WCWRFlushErr, 4)
	waitState(t, p.a.qp, verbs.QPSErr)
	if !bytes.Equal(p.b.buf[:64], make([]byte, 64)) {
		t.Fatal("a refused write changed memory")
	}
	// The QP's own access flags count as much as the region's.
	o = defaultOpts()
	o.qpAccess = verbs.AccessRemoteWrite
	q := newPair(t, env, o)
	check(t, q.a.qp.PostSend(&verbs.SendWR{WRID: 5, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{q.a.mr.SGE(0, 64)}, RemoteAddr: q.b.mr.Addr(), RKey: q.b.mr.RKey()}))
	pollOne(t, q.a.cq, verbs.WCRemAccessErr, 5)
	waitState(t, q.a.qp, verbs.QPSErr)
}

func testBadRKey(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 3, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{p.a.mr.SGE(0, 64)}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey() + 1}))
	pollOne(t, p.a.cq, verbs.WCRemAccessErr, 3)
	waitState(t, p.a.qp, verbs.QPSErr)
	// Beyond the region's end.
	q := newPair(t, env, defaultOpts())
	check(t, q.a.qp.PostSend(&verbs.SendWR{WRID: 4, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{q.a.mr.SGE(0, 64)}, RemoteAddr: q.b.mr.Addr() + uint64(len(q.b.buf)) - 32, RKey: q.b.mr.RKey()}))
	pollOne(t, q.a.cq, verbs.WCRemAccessErr, 4)
}

func testRecvTooSmall(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{p.b.mr.SGE(0, 100)}}))
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 2, SG: []verbs.SGE{p.b.mr.SGE(0, 100)}}))
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 3, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{p.a.mr.SGE(0, 101)}}))
	pollOne(t, p.b.cq, verbs.WCLocLenErr, 1)
	pollOne(t, p.b.cq, verbs.WCWRFlushErr, 2)
	pollOne(t, p.a.cq, verbs.WCRemInvReqErr, 3)
	waitState(t, p.b.qp, verbs.QPSErr)
	waitState(t, p.a.qp, verbs.QPSErr)
}

func testFlushOnError(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	// Receives outstanding; sends that cannot complete (no receive on the
	// peer... the peer's receives are the ones we flush, so use a QP that
	// is not connected for the sends).
	for i := range 5 {
		check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: uint64(10 + i), SG: []verbs.SGE{p.b.mr.SGE(0, 64)}}))
	}
	check(t, p.b.qp.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState))
	wcs := poll(t, p.b.cq, 5)
	for i, wc := range wcs {
		if wc.Status != verbs.WCWRFlushErr || wc.WRID != uint64(10+i) || wc.QPNum != p.b.qp.Num() {
			t.Fatalf("flushed receive %d: %+v", i, wc)
		}
	}
	// Requests posted to a QP in the error state are flushed too, signaled
	// or not.
	for i := range 3 {
		check(t, p.b.qp.PostSend(&verbs.SendWR{WRID: uint64(20 + i), Opcode: verbs.WRSend, SG: []verbs.SGE{p.b.mr.SGE(0, 8)}}))
	}
	wcs = poll(t, p.b.cq, 3)
	for i, wc := range wcs {
		if wc.Status != verbs.WCWRFlushErr || wc.WRID != uint64(20+i) {
			t.Fatalf("flushed send %d: %+v", i, wc)
		}
	}
	// Outstanding sends are flushed when the requester moves to ERR: a
	// peer that is not ready holds them (RNR: no receives).
	o := defaultOpts()
	o.rnrRetry = 7
	o.minRNR = 31 // half a second between RNR retries
	q := newPair(t, env, o)
	for i := range 4 {
		check(t, q.a.qp.PostSend(&verbs.SendWR{WRID: uint64(30 + i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{q.a.mr.SGE(0, 8)}}))
	}
	noCompletion(t, q.a.cq, 2*time.Millisecond)
	check(t, q.a.qp.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState))
	wcs = poll(t, q.a.cq, 4)
	for i, wc := range wcs {
		if wc.Status != verbs.WCWRFlushErr || wc.WRID != uint64(30+i) {
			t.Fatalf("flushed outstanding send %d: %+v", i, wc)
		}
	}
	// RESET takes the QP back, with empty queues, ready to connect again.
	check(t, q.a.qp.Modify(&verbs.QPAttr{State: verbs.QPSReset}, verbs.QPAttrState))
	a, _, err := q.a.qp.Query(verbs.QPAttrState)
	if err != nil || a.State != verbs.QPSReset {
		t.Fatalf("after reset: %v %v", a.State, err)
	}
}

func testTransitions(t *testing.T, env Env) {
	o := defaultOpts()
	o.noConnect = true
	p := newPair(t, env, o)
	qp := p.a.qp
	var terr *verbs.TransitionError
	// RESET->INIT without PORT.
	err := qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, AccessFlags: o.qpAccess}, verbs.QPAttrState|verbs.QPAttrPkeyIndex|verbs.QPAttrAccessFlags)
	if !errors.As(err, &terr) || terr.Missing != verbs.QPAttrPort || terr.Extra != 0 || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("missing PORT: %v", err)
	}
	// RESET->INIT with an attribute it does not take.
	err = qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: o.qpAccess, SQPSN: 1},
		verbs.QPAttrState|verbs.QPAttrPkeyIndex|verbs.QPAttrPort|verbs.QPAttrAccessFlags|verbs.QPAttrSQPSN)
	if !errors.As(err, &terr) || terr.Extra != verbs.QPAttrSQPSN || terr.Missing != 0 {
		t.Fatalf("extra SQ_PSN: %v", err)
	}
	// RESET->RTS is no transition at all.
	err = qp.Modify(&verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState)
	if !errors.As(err, &terr) || !terr.Invalid {
		t.Fatalf("RESET->RTS: %v", err)
	}
	check(t, qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: o.qpAccess},
		verbs.QPAttrState|verbs.QPAttrPkeyIndex|verbs.QPAttrPort|verbs.QPAttrAccessFlags))
	// INIT->RTR missing the destination QPN and MIN_RNR_TIMER.
	err = qp.Modify(&verbs.QPAttr{State: verbs.QPSRTR, PathMTU: o.mtu, RQPSN: 1, MaxDestRdAtomic: 1,
		AH: verbs.AHAttr{IsGlobal: true, Port: 1, GRH: verbs.GlobalRoute{DGID: p.b.port.GID}}},
		verbs.QPAttrState|verbs.QPAttrAV|verbs.QPAttrPathMTU|verbs.QPAttrRQPSN|verbs.QPAttrMaxDestRdAtomic)
	if !errors.As(err, &terr) || terr.Missing != verbs.QPAttrDestQPN|verbs.QPAttrMinRNRTimer {
		t.Fatalf("INIT->RTR without DEST_QPN and MIN_RNR_TIMER: %v", err)
	}
	// The device refuses what the state table cannot see: an MTU above
	// the port's.
	err = qp.Modify(&verbs.QPAttr{State: verbs.QPSRTR, PathMTU: 6, DestQPN: p.b.qp.Num(), RQPSN: 1, MaxDestRdAtomic: 1, MinRNRTimer: 1,
		AH: verbs.AHAttr{IsGlobal: true, Port: 1, GRH: verbs.GlobalRoute{DGID: p.b.port.GID}}},
		verbs.QPAttrState|verbs.QPAttrAV|verbs.QPAttrPathMTU|verbs.QPAttrDestQPN|verbs.QPAttrRQPSN|verbs.QPAttrMaxDestRdAtomic|verbs.QPAttrMinRNRTimer)
	if !errors.Is(err, syscall.EINVAL) || errors.As(err, &terr) {
		t.Fatalf("invalid MTU: %v", err)
	}
	a, _, err := qp.Query(verbs.QPAttrState)
	if err != nil || a.State != verbs.QPSInit {
		t.Fatalf("failed modifies changed the state to %v (%v)", a.State, err)
	}
	// Any state may go to ERR and RESET.
	check(t, qp.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState))
	err = qp.Modify(&verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState)
	if !errors.As(err, &terr) || !terr.Invalid || terr.Cur != verbs.QPSErr {
		t.Fatalf("ERR->RTS: %v", err)
	}
	check(t, qp.Modify(&verbs.QPAttr{State: verbs.QPSReset}, verbs.QPAttrState))
}

// testSQDrain takes a QP with work outstanding to SQD: the device reports
// the send queue drained, and the QP goes back to RTS and works.
func testSQDrain(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	for i := range 4 {
		check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: uint64(i), SG: []verbs.SGE{p.b.mr.SGE(0, 4096)}}))
		check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{p.a.mr.SGE(0, 3000)}}))
	}
	check(t, p.a.qp.Modify(&verbs.QPAttr{State: verbs.QPSSQD, EnSQDAsyncNotify: true}, verbs.QPAttrState|verbs.QPAttrEnSQDAsyncNotify))
	ev := waitAsync(t, p.a.ctx, verbs.EventSQDrained)
	if ev.QP != p.a.qp {
		t.Fatalf("drained event %+v for another QP", ev)
	}
	poll(t, p.a.cq, 4)
	poll(t, p.b.cq, 4)
	a, _, err := p.a.qp.Query(verbs.QPAttrState)
	if err != nil || a.State != verbs.QPSSQD || a.SQDraining {
		t.Fatalf("after draining: %+v %v", a, err)
	}
	// SQD->SQD may change the timeout; SQD->RTS resumes.
	check(t, p.a.qp.Modify(&verbs.QPAttr{Timeout: 15}, verbs.QPAttrTimeout))
	check(t, p.a.qp.Modify(&verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState))
	sendRecv(t, p, 500, 9)
}

func testBusy(t *testing.T, env Env) {
	p := newPair(t, env, defaultOpts())
	expectErrno(t, p.a.cq.Close(), syscall.EBUSY, "destroy a CQ a QP uses")
	expectErrno(t, p.a.pd.Close(), syscall.EBUSY, "dealloc a PD with a QP and an MR")
	expectErrno(t, p.a.ctx.Close(), syscall.EBUSY, "close a device with live objects")
	expectErrno(t, verbs.Free(p.a.buf), syscall.EBUSY, "free registered memory")
	// The objects still work.
	sendRecv(t, p, 100, 1)
	ch, err := p.a.ctx.CreateCompChannel()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := p.a.ctx.CreateCQ(8, ch, 0)
	if err != nil {
		t.Fatal(err)
	}
	expectErrno(t, ch.Close(), syscall.EBUSY, "destroy a channel a CQ uses")
	check(t, cq.Close())
	check(t, ch.Close())
}

func testRNRRetryExceeded(t *testing.T, env Env) {
	o := defaultOpts()
	o.rnrRetry = 0
	p := newPair(t, env, o)
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{p.a.mr.SGE(0, 8)}}))
	pollOne(t, p.a.cq, verbs.WCRNRRetryExcErr, 1)
	waitState(t, p.a.qp, verbs.QPSErr)
}

func testRNRRecovers(t *testing.T, env Env) {
	o := defaultOpts()
	o.rnrRetry = 7 // retry for ever
	o.minRNR = 1   // 10 µs between tries
	p := newPair(t, env, o)
	fill(p.a.buf[:5000], 4)
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{p.a.mr.SGE(0, 5000)}}))
	noCompletion(t, p.a.cq, 2*time.Millisecond)
	check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: 2, SG: []verbs.SGE{p.b.mr.SGE(0, 8192)}}))
	pollOne(t, p.a.cq, verbs.WCSuccess, 1)
	wc := pollOne(t, p.b.cq, verbs.WCSuccess, 2)
	if wc.ByteLen != 5000 || !bytes.Equal(p.a.buf[:5000], p.b.buf[:5000]) {
		t.Fatalf("after RNR: %+v", wc)
	}
}

func testRetryExceeded(t *testing.T, env Env) {
	o := defaultOpts()
	o.noConnect = true
	o.timeout = 1 // 8 µs
	o.retryCnt = 2
	p := newPair(t, env, o)
	// Connect a to a QP number nobody has: its packets are never answered.
	connectTo(t, p.a, p.b.port.GID, 0xfffff0, o)
	check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{p.a.mr.SGE(0, 8)}}))
	pollOne(t, p.a.cq, verbs.WCRetryExcErr, 1)
	waitState(t, p.a.qp, verbs.QPSErr)
}
