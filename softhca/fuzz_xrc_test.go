//go:build linux

package softhca

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/softhca/roce"
	"github.com/xrcrun/xrc/verbs"
)

// FuzzXRCDatagram sends arbitrary XRC (and other) packets at an XRC
// receive QP whose domain holds two XRC SRQs (of two PDs), beside an XRC
// SRQ of another domain. Whatever comes: the device does not fail, nothing
// reaches the other domain's SRQ, every receive completion names the
// receive QP and a WQE of its domain's SRQs, memory outside the regions
// is untouched, everything the device answers is an XRC packet, and the
// input leaves no object behind.

var (
	xfDevAddr  = netip.MustParseAddr("127.7.2.1")
	xfPeerAddr = netip.MustParseAddr("127.7.2.2")
)

const (
	xfPeerQPN = 0x99
	xfBufSize = 1 << 16
	xfOff1    = 0x1000 // region of pd1: [xfOff1, xfOff1+xfLen)
	xfOff2    = 0x5000 // region of pd2
	xfLen     = 0x2000
	xfRecv    = 0x9000 // receive buffers, of pd1 and pd2
)

// Flags of a record.
const (
	xfToQP  = 1 << 0 // the packet goes to the receive QP
	xfSRQ   = 3 << 1 // 1, 2, 3: XRCETH names srq1, srq2 or the foreign SRQ
	xfRelVA = 1 << 3 // RETH/AtomicETH address relative to the buffer
)

type xfWorld struct {
	d, sink        *Device
	ctx            *verbs.Context
	pd1, pd2       *verbs.PD
	buf            []byte
	mr1, mr2, mrR1 *verbs.MR
	mrR2           *verbs.MR
	cq, cqF        *verbs.CQ
	x, xF          *verbs.XRCD
	objs           Objects
	scratch        datagramScratch
}

func newXFWorld(tb testing.TB) *xfWorld {
	f := NewFabric()
	w := &xfWorld{}
	var err error
	if w.d, err = New(context.Background(), Config{Name: "fuzzxrc0", Addr: xfDevAddr, Fabric: f, SpinIdle: -1}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { w.d.Close() })
	w.sink = newSink(tb, f, xfPeerAddr.String())
	must := func(err error) {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
	}
	w.ctx, err = w.d.Open(verbs.Config{})
	must(err)
	tb.Cleanup(func() { w.ctx.Close() })
	w.pd1, err = w.ctx.AllocPD()
	must(err)
	w.pd2, err = w.ctx.AllocPD()
	must(err)
	w.buf, err = verbs.Alloc(xfBufSize)
	must(err)
	rw := verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic
	w.mr1, err = w.pd1.RegMR(w.buf[xfOff1:xfOff1+xfLen], rw)
	must(err)
	w.mr2, err = w.pd2.RegMR(w.buf[xfOff2:xfOff2+xfLen], rw)
	must(err)
	w.mrR1, err = w.pd1.RegMR(w.buf[xfRecv:xfRecv+0x1000], verbs.AccessLocalWrite)
	must(err)
	w.mrR2, err = w.pd2.RegMR(w.buf[xfRecv+0x1000:xfRecv+0x2000], verbs.AccessLocalWrite)
	must(err)
	w.cq, err = w.ctx.CreateCQ(255, nil, 0)
	must(err)
	w.cqF, err = w.ctx.CreateCQ(255, nil, 0)
	must(err)
	w.x, err = w.ctx.OpenXRCD(nil, os.O_CREATE)
	must(err)
	w.xF, err = w.ctx.OpenXRCD(nil, os.O_CREATE)
	must(err)
	w.objs = w.d.Objects()
	return w
}

// xfInput is what one input runs against: fresh SRQs and receive QP.
type xfInput struct {
	srq1, srq2, srqF *verbs.SRQ
	tgt              *verbs.QP
	wrids            map[uint64]bool // WQEs of srq1 and srq2 not completed
}

func (w *xfWorld) setUp(t testing.TB) *xfInput {
	for i := range w.buf {
		w.buf[i] = byte(i*5 + 3)
	}
	clear(w.buf[xfRecv : xfRecv+0x2000])
	in := &xfInput{wrids: map[uint64]bool{}}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var err error
	attr := verbs.SRQAttr{MaxWR: 8, MaxSGE: 1}
	in.srq1, err = w.pd1.CreateXRCSRQ(w.x, w.cq, attr)
	must(err)
	in.srq2, err = w.pd2.CreateXRCSRQ(w.x, w.cq, attr)
	must(err)
	in.srqF, err = w.pd1.CreateXRCSRQ(w.xF, w.cqF, attr)
	must(err)
	for i := range 4 {
		must(in.srq1.PostRecv(&verbs.RecvWR{WRID: uint64(0x100 + i), SG: []verbs.SGE{w.mrR1.SGE(i*1024, 1024)}}))
		must(in.srq2.PostRecv(&verbs.RecvWR{WRID: uint64(0x200 + i), SG: []verbs.SGE{w.mrR2.SGE(i*1024, 1024)}}))
		must(in.srqF.PostRecv(&verbs.RecvWR{WRID: uint64(0x300 + i), SG: []verbs.SGE{w.mrR1.SGE(i*1024, 1024)}}))
		in.wrids[uint64(0x100+i)], in.wrids[uint64(0x200+i)] = true, true
	}
	in.tgt, err = w.x.CreateTgtQP()
	must(err)
	steps := []struct {
		a verbs.QPAttr
		m verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic},
			verbs.QPAttrState | verbs.QPAttrPkeyIndex | verbs.QPAttrPort | verbs.QPAttrAccessFlags},
		{verbs.QPAttr{State: verbs.QPSRTR, PathMTU: verbs.MTU1024, DestQPN: xfPeerQPN, RQPSN: 0x100, MaxDestRdAtomic: 4, MinRNRTimer: 1,
			AH: verbs.AHAttr{IsGlobal: true, Port: 1, GRH: verbs.GlobalRoute{DGID: verbs.GID(w.sink.gid), HopLimit: 64}}},
			verbs.QPAttrState | verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN |
				verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer},
	}
	for _, s := range steps {
		must(in.tgt.Modify(&s.a, s.m))
	}
	return in
}

// datagram makes a record into a datagram from the peer.
func (w *xfWorld) datagram(in *xfInput, flags byte, body []byte) []byte {
	b := append([]byte(nil), body...)
	if len(b) >= roce.BTHLen {
		op := roce.Opcode(b[0])
		if flags&xfToQP != 0 {
			n := in.tgt.Num()
			b[5], b[6], b[7] = byte(n>>16), byte(n>>8), byte(n)
		}
		off := roce.BTHLen
		if op.HasXRCETH() && len(b) >= off+4 {
			if k := flags & xfSRQ >> 1; k != 0 {
				srqn := [...]uint32{0, in.srq1.Num(), in.srq2.Num(), in.srqF.Num()}[k]
				binary.BigEndian.PutUint32(b[off:], srqn)
			}
			off += 4
		}
		if flags&xfRelVA != 0 && (op.HasRETH() || op.HasAtomicETH()) && len(b) >= off+8 {
			va := binary.BigEndian.Uint64(b[off:])
			binary.BigEndian.PutUint64(b[off:], va+uint64(unix.AddrOf(w.buf)))
		}
	}
	if len(b) < roce.BTHLen {
		return append(b, 0, 0, 0, 0) // too short to have an ICRC
	}
	ip, udp := roce.PseudoHeaders(w.scratch.hdr[:], xfPeerAddr, xfDevAddr, dgSrcPort, len(b))
	return binary.LittleEndian.AppendUint32(b, roce.ICRC(ip, udp, b))
}

// run plays one input and returns how many receives completed.
func (w *xfWorld) run(t *testing.T, s []byte) int {
	in := w.setUp(t)
	closed := false
	defer func() {
		if !closed { // a failure: leave the world as it was for the next input
			for _, c := range []interface{ Close() error }{in.tgt, in.srq1, in.srq2, in.srqF} {
				c.Close()
			}
		}
	}()
	var ps []*roce.Packet
	for len(s) >= 3 {
		f, n := s[0], min(int(binary.LittleEndian.Uint16(s[1:])), len(s)-3)
		b := w.datagram(in, f, s[3:3+n])
		s = s[3+n:]
		if p := w.d.parseDatagram(b, netip.AddrPortFrom(xfPeerAddr, dgSrcPort), &w.scratch, nil); p != nil {
			ps = append(ps, p)
		}
		if len(ps) == 64 {
			break
		}
	}
	w.d.eng.deliverAll(ps)
	for deadline := time.Now().Add(10 * time.Second); !w.d.eng.quiet(); time.Sleep(20 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatal("the engine is still busy after 10 s")
		}
	}
	for _, p := range w.sink.drain() {
		if p.Opcode.Transport() != roce.TransportXRC || p.DestQP != xfPeerQPN {
			t.Fatalf("the receive QP sent %v to QP %#x", p.Opcode, p.DestQP)
		}
		putPacket(p)
	}
	wc := make([]verbs.WorkCompletion, 16)
	recvs := 0
	if n, err := w.cqF.Poll(wc); n != 0 || err != nil {
		t.Fatalf("the other domain's SRQ completed %+v (%v)", wc[:n], err)
	}
	for {
		n, err := w.cq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		for _, c := range wc[:n] {
			if c.QPNum != in.tgt.Num() || !in.wrids[c.WRID] {
				t.Fatalf("completion %+v: not of the receive QP %#x and its domain's SRQs", c, in.tgt.Num())
			}
			delete(in.wrids, c.WRID)
			if c.Status == verbs.WCSuccess {
				recvs++
			}
		}
	}
	for i := range w.buf {
		inRegion := i >= xfOff1 && i < xfOff1+xfLen || i >= xfOff2 && i < xfOff2+xfLen || i >= xfRecv && i < xfRecv+0x2000
		if !inRegion && w.buf[i] != byte(i*5+3) {
			t.Fatalf("byte %#x outside the regions changed", i)
		}
	}
	closed = true
	for _, c := range []interface{ Close() error }{in.tgt, in.srq1, in.srq2, in.srqF} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if o := w.d.Objects(); o != w.objs {
		t.Fatalf("objects after the input: %+v, before: %+v", o, w.objs)
	}
	return recvs
}

// xfSeeds: a message of each kind to each SRQ, a message split across
// SRQs, and packets the receive QP must not take.
func xfSeeds() [][]byte {
	xrc := func(op roce.Opcode) roce.Opcode { return op | roce.TransportXRC }
	rec := func(s *[]byte, flags byte, b []byte) {
		*s = append(*s, flags, byte(len(b)), byte(len(b)>>8))
		*s = append(*s, b...)
	}
	var out [][]byte
	one := func(flags byte, b []byte) {
		var s []byte
		rec(&s, flags, b)
		out = append(out, s)
	}
	to := func(k byte) byte { return xfToQP | k<<1 | xfRelVA }
	one(to(1), dgPacket(xrc(roce.SendOnly), 0x100, withPayload(100)))
	one(to(2), dgPacket(xrc(roce.SendOnlyImm), 0x100, func(p *roce.Packet) { p.Imm = 7; p.Payload = []byte("imm") }))
	one(to(3), dgPacket(xrc(roce.SendOnly), 0x100, withPayload(10))) // another domain: NAK
	one(to(0), dgPacket(xrc(roce.SendOnly), 0x100, withPayload(10))) // XRCETH of no SRQ
	one(to(1), dgPacket(roce.SendOnly, 0x100, withPayload(10)))      // an RC packet
	one(to(1), dgPacket(xrc(roce.Acknowledge), 0x100, nil))          // a response
	one(to(1), dgPacket(xrc(roce.WriteOnly), 0x100, func(p *roce.Packet) {
		withRETH(xfOff1+8, w0key, 16)(p)
		p.Payload = bytes.Repeat([]byte{'W'}, 16)
	}))
	one(to(1), dgPacket(xrc(roce.ReadRequest), 0x100, withRETH(xfOff1, w0key, 2000)))
	one(to(2), dgPacket(xrc(roce.FetchAdd), 0x100, func(p *roce.Packet) { p.VA, p.RKey, p.SwapAdd = xfOff2, w1key, 1 }))
	var s []byte // a SEND whose middle packet names the other SRQ
	rec(&s, to(1), dgPacket(xrc(roce.SendFirst), 0x100, withPayload(1024)))
	rec(&s, to(2), dgPacket(xrc(roce.SendMiddle), 0x101, withPayload(1024)))
	rec(&s, to(1), dgPacket(xrc(roce.SendLast), 0x102, withPayload(5)))
	out = append(out, s)
	return out
}

// The keys the seeds use: the world registers its regions in this order
// on a fresh device, so their keys are known (and the fuzzer finds others).
const (
	w0key = 1<<8 | 1
	w1key = 2<<8 | 2
)

func FuzzXRCDatagram(f *testing.F) {
	w := newXFWorld(f)
	if w.mr1.RKey() != w0key || w.mr2.RKey() != w1key {
		f.Fatalf("region keys %#x and %#x, the seeds use %#x and %#x", w.mr1.RKey(), w.mr2.RKey(), w0key, w1key)
	}
	for _, s := range xfSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s []byte) { w.run(t, s) })
}

// TestXRCDatagramSeeds checks that the seeds do what they are for: the
// first delivers a message to srq1, the third none to the other domain.
func TestXRCDatagramSeeds(t *testing.T) {
	w := newXFWorld(t)
	seeds := xfSeeds()
	if n := w.run(t, seeds[0]); n != 1 || w.d.Counters().XRCSRQErrors.Load() != 0 {
		t.Fatalf("a good XRC SEND: %d receives", n)
	}
	if n := w.run(t, seeds[2]); n != 0 || w.d.Counters().XRCSRQErrors.Load() != 1 {
		t.Fatalf("a SEND to another domain's SRQ: %d receives, %d refused", n, w.d.Counters().XRCSRQErrors.Load())
	}
	for _, s := range seeds {
		w.run(t, s)
	}
}
