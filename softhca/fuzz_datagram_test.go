//go:build linux

package softhca

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xrcrun/xrc/internal/qpstate"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/softhca/roce"
	"github.com/xrcrun/xrc/verbs"
)

// FuzzDatagram sends arbitrary RoCEv2 datagrams at a device and checks that
// they never crash it, corrupt memory or wedge it, and that every datagram
// is accounted for.
//
// The device is driven only as real traffic drives it: each datagram goes
// through parseDatagram, the length, ICRC and decoding checks of the UDP
// link, and a packet that passes is queued to the engine, which receives it
// in its round as it receives what the link polls. What the device sends
// goes to a sink peer whose engine never runs. Timers read a fake clock that
// only the harness moves, so a run is repeatable.
//
// Each input starts from the same state: three RC QPs connected to the
// sink, with work outstanding on both sides (see dgSetUp), over memory
// regions of known keys laid out in one buffer with guard pages between
// them.
//
// An input is a script of up to dgMaxRecords records: a flags byte, a
// 16-bit little-endian length and that many bytes, the transport part of a
// datagram (headers, payload, pad). The flags say how the harness sends
// it:
const (
	dgRaw      = 1 << 0 // the bytes are the whole datagram, ICRC and all; else the harness appends the right ICRC
	dgTarget   = 3 << 1 // 0, 1, 2: the harness sets the BTH destination QP to QP A, B or C; 3: as given
	dgRelVA    = 1 << 3 // the RETH or AtomicETH VA is an offset in the harness's buffer
	dgStranger = 1 << 4 // sent from an address that is not the QPs' peer
	dgIPv6     = 1 << 5 // with dgStranger: from an IPv6 address
	dgBurst    = 1 << 6 // delivered in one engine round with the next record
	dgTick     = 1 << 7 // not a datagram: time passes until the device's next timer
)

const dgMaxRecords = 16

// The harness's buffer: memory regions with guard pages around them. Only
// mrRemote and mrRecv may change; the rest must keep its bytes.
const (
	dgBufSize = 64 << 10
	offRemote = 0x1000 // remote read, write and atomic (and local write)
	lenRemote = 0x2000
	offRO     = 0x4000 // remote read only
	lenRO     = 0x1000
	offRecv   = 0x6000 // local write only: receive buffers, READ and atomic results
	lenRecv   = 0x4000
	offSrc    = 0xb000 // no access flags: what the sends send
	lenSrc    = 0x2000
	offOther  = 0xe000 // remote read, write, atomic, in another PD
	lenOther  = 0x1000
)

// The three QPs of each input.
type dgQPConf struct {
	peerQPN uint32
	psn     uint32
	mtu     verbs.MTU
	access  verbs.Access
	rts     bool // else RTR: a responder only
	srq     bool
}

var dgQPConfs = [3]dgQPConf{
	// A: both sides busy: SEND, READ, atomics and WRITE outstanding,
	// receives posted, all of remote access.
	{peerQPN: 0x999, psn: 0x1234, mtu: verbs.MTU1024, rts: true,
		access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic},
	// B: on an SRQ, one SEND outstanding, remote write only, small MTU.
	{peerQPN: 0x998, psn: 0x5678, mtu: verbs.MTU256, rts: true, srq: true,
		access: verbs.AccessRemoteWrite},
	// C: RTR, no receives posted, remote read and atomic only.
	{peerQPN: 0x997, psn: 0x9abc, mtu: verbs.MTU4096,
		access: verbs.AccessRemoteRead | verbs.AccessRemoteAtomic},
}

var (
	dgDevAddr      = netip.MustParseAddr("127.7.1.1")
	dgPeerAddr     = netip.MustParseAddr("127.7.1.2")
	dgStrangerAddr = netip.MustParseAddr("127.7.1.3")
	dgStranger6    = netip.MustParseAddr("2001:db8::3")
)

const dgSrcPort = 0xc0de

// fakeClock is a Clock that moves only when the harness says.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c      *fakeClock
	at     time.Time
	f      func()
	active bool
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f, active: true}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.active = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.at, t.active = t.c.now.Add(d), true
	return was
}

// advance moves the clock to at, if it is later, without running timers.
func (c *fakeClock) advance(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if at.After(c.now) {
		c.now = at
	}
}

// fire moves the clock to the earliest armed timer and runs it. It reports
// false if no timer is armed.
func (c *fakeClock) fire() bool {
	c.mu.Lock()
	var next *fakeTimer
	for _, t := range c.timers {
		if t.active && (next == nil || t.at.Before(next.at)) {
			next = t
		}
	}
	if next == nil {
		c.mu.Unlock()
		return false
	}
	if next.at.After(c.now) {
		c.now = next.at
	}
	next.active = false
	c.mu.Unlock()
	next.f()
	return true
}

// quiet reports whether the engine has no work: it has decided to sleep
// and nothing was queued since. It looks again at whether the engine
// sleeps after it found the queues empty: between the first look and the
// queues, the engine may have woken for the work just queued, cleared
// pending and taken the queues, and be running the round (the fuzz
// target's set-up then drained its packets before they were sent: "0
// packets sent, want 9", and 9 came 200 ms later).
func (e *engine) quiet() bool {
	if !e.sleeping.Load() || e.pending.Load() {
		return false
	}
	e.qmu.Lock()
	empty := len(e.rx) == 0 && len(e.bells) == 0
	e.qmu.Unlock()
	return empty && e.sleeping.Load() && !e.pending.Load()
}

// deliverAll queues packets for the device at once, so that the engine
// takes them in one round, as it takes a batch it polled from its socket.
func (e *engine) deliverAll(ps []*roce.Packet) {
	e.qmu.Lock()
	e.rx = append(e.rx, ps...)
	e.qmu.Unlock()
	e.kick()
}

// dgWorld is what lives as long as the fuzzing process: the device, its
// peer, a client with its PDs, regions and CQs.
type dgWorld struct {
	d, sink  *Device
	clock    *fakeClock
	ctx      *verbs.Context
	pd, pd2  *verbs.PD
	buf      []byte
	init     []byte // the buffer as each input starts
	mrRemote *verbs.MR
	mrRO     *verbs.MR
	mrRecv   *verbs.MR
	mrSrc    *verbs.MR
	mrOther  *verbs.MR
	scq, rcq *verbs.CQ
	cqErrs   atomic.Int64 // CQ_ERR events: a CQ overran
	objs     Objects      // the device's objects between inputs
	scratch  datagramScratch
	broken   bool // an input failed: what it left behind would fail the next
}

// newDGWorld sets up a world; close releases it.
func newDGWorld(tb testing.TB) *dgWorld {
	f := NewFabric()
	w := &dgWorld{clock: &fakeClock{now: time.Unix(1e9, 0)}}
	var err error
	w.d, err = New(context.Background(), Config{Name: "fuzzdg0", Addr: dgDevAddr, Fabric: f, SpinIdle: -1, Clock: w.clock})
	if err != nil {
		tb.Fatal(err)
	}
	w.sink = newSink(tb, f, dgPeerAddr.String())
	must := func(err error) {
		tb.Helper()
		if err != nil {
			w.close()
			tb.Fatal(err)
		}
	}
	w.ctx, err = w.d.Open(verbs.Config{})
	must(err)
	w.pd, err = w.ctx.AllocPD()
	must(err)
	w.pd2, err = w.ctx.AllocPD()
	must(err)
	w.buf, err = verbs.Alloc(dgBufSize)
	must(err)
	w.init = make([]byte, dgBufSize)
	for i := range w.init {
		w.init[i] = byte(i*7 + i>>8 + 1)
	}
	for _, g := range [][2]int{{0, offRemote}, {offRemote + lenRemote, offRO}, {offRO + lenRO, offRecv},
		{offRecv + lenRecv, offSrc}, {offSrc + lenSrc, offOther}, {offOther + lenOther, dgBufSize}} {
		for i := g[0]; i < g[1]; i++ {
			w.init[i] = 0xa5 ^ byte(i)
		}
	}
	clear(w.init[offRecv : offRecv+lenRecv])
	copy(w.buf, w.init)
	rw := verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteWrite | verbs.AccessRemoteAtomic
	w.mrRemote, err = w.pd.RegMR(w.buf[offRemote:offRemote+lenRemote], rw)
	must(err)
	w.mrRO, err = w.pd.RegMR(w.buf[offRO:offRO+lenRO], verbs.AccessRemoteRead)
	must(err)
	w.mrRecv, err = w.pd.RegMR(w.buf[offRecv:offRecv+lenRecv], verbs.AccessLocalWrite)
	must(err)
	w.mrSrc, err = w.pd.RegMR(w.buf[offSrc:offSrc+lenSrc], 0)
	must(err)
	w.mrOther, err = w.pd2.RegMR(w.buf[offOther:offOther+lenOther], rw)
	must(err)
	w.scq, err = w.ctx.CreateCQ(255, nil, 0)
	must(err)
	w.rcq, err = w.ctx.CreateCQ(255, nil, 0)
	must(err)
	go func() {
		for {
			ev, err := w.ctx.GetAsyncEvent(context.Background())
			if err != nil {
				return
			}
			if ev.Type == verbs.EventCQErr {
				w.cqErrs.Add(1)
			}
		}
	}()
	w.objs = w.d.Objects()
	return w
}

func (w *dgWorld) close() {
	if w.ctx != nil {
		w.ctx.Close()
	}
	w.d.Close()
}

// waitQuiet waits until the engine has done everything it was given.
func (w *dgWorld) waitQuiet(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; !w.d.eng.quiet(); i++ {
		if i < 100 {
			runtime.Gosched()
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("wedged: the engine is still busy after 10 seconds")
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// dgInput is the per-input state: the QPs and what was posted to them.
type dgInput struct {
	qps     [3]*verbs.QP
	nums    [3]uint32
	srq     *verbs.SRQ
	sends   [3][]uint64 // signaled send WRIDs, in posting order
	recvs   [3][]uint64 // receive WRIDs of the receive queue, in order
	recvLen map[uint64]uint32
	srqWRs  map[uint64]bool // posted to the SRQ and not completed
	gotSend [3]int          // completions polled: sends[i][:gotSend[i]]
	sendErr [3]bool         // a send completed in error: the rest must too
	gotRecv [3]int
}

// qpIndex returns which of the input's QPs has number n, or -1.
func (in *dgInput) qpIndex(n uint32) int {
	for i, x := range in.nums {
		if x == n {
			return i
		}
	}
	return -1
}

func (w *dgWorld) connect(qp *verbs.QP, c dgQPConf) error {
	steps := []struct {
		attr verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: c.access},
			verbs.QPAttrState | verbs.QPAttrPkeyIndex | verbs.QPAttrPort | verbs.QPAttrAccessFlags},
		{verbs.QPAttr{State: verbs.QPSRTR, PathMTU: c.mtu, DestQPN: c.peerQPN, RQPSN: c.psn,
			MaxDestRdAtomic: 4, MinRNRTimer: 1,
			AH: verbs.AHAttr{IsGlobal: true, Port: 1, GRH: verbs.GlobalRoute{DGID: verbs.GID(w.sink.gid), HopLimit: 64}}},
			verbs.QPAttrState | verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN |
				verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer},
		{verbs.QPAttr{State: verbs.QPSRTS, Timeout: 14, RetryCnt: 2, RNRRetry: 2, SQPSN: c.psn, MaxRdAtomic: 4},
			verbs.QPAttrState | verbs.QPAttrTimeout | verbs.QPAttrRetryCnt | verbs.QPAttrRNRRetry |
				verbs.QPAttrSQPSN | verbs.QPAttrMaxQPRdAtomic},
	}
	if !c.rts {
		steps = steps[:2]
	}
	for _, st := range steps {
		if err := qp.Modify(&st.attr, st.mask); err != nil {
			return err
		}
	}
	return nil
}

// The sink-side addresses the outstanding READ, atomics and WRITE name.
const dgPeerVA, dgPeerRKey = 0x10000, 0x77

// setUp creates the QPs of an input and brings them to their known state.
// On QP A: a SEND of 3000 bytes (PSNs 0x1234-0x1236), a READ of 2000
// (0x1237-0x1238), a FETCH_ADD (0x1239), a WRITE of 100 (0x123a), a
// COMPARE_SWAP (0x123b) and an inline SEND with immediate (0x123c) are
// outstanding, and four receives of 2048 bytes are posted. On QP B, a SEND
// of 64 bytes (0x5678) is outstanding and its SRQ holds four receives of
// 512 bytes, its limit armed at 2. QP C is at RTR with no receive posted.
func (w *dgWorld) setUp(t testing.TB) *dgInput {
	t.Helper()
	copy(w.buf, w.init)
	w.sink.drain()
	in := &dgInput{recvLen: map[uint64]uint32{}, srqWRs: map[uint64]bool{}}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var err error
	in.srq, err = w.pd.CreateSRQ(verbs.SRQAttr{MaxWR: 8, MaxSGE: 1})
	must(err)
	for i := range dgQPConfs {
		c := dgQPConfs[i]
		attr := &verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: w.scq, RecvCQ: w.rcq,
			Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}}
		if c.srq {
			attr.SRQ = in.srq
			attr.Cap.MaxRecvWR, attr.Cap.MaxRecvSGE = 0, 0
		}
		in.qps[i], err = w.pd.CreateQP(attr)
		must(err)
		in.nums[i] = in.qps[i].Num()
		must(w.connect(in.qps[i], c))
	}
	a := in.qps[0]
	for i := range 4 {
		id := uint64(0x100 + i)
		must(a.PostRecv(&verbs.RecvWR{WRID: id, SG: []verbs.SGE{w.mrRecv.SGE(i*2048, 2048)}}))
		in.recvs[0] = append(in.recvs[0], id)
		in.recvLen[id] = 2048
	}
	for i := range 4 {
		id := uint64(0x200 + i)
		must(in.srq.PostRecv(&verbs.RecvWR{WRID: id, SG: []verbs.SGE{w.mrRecv.SGE(0x2000+i*512, 512)}}))
		in.srqWRs[id] = true
		in.recvLen[id] = 512
	}
	must(in.srq.Modify(verbs.SRQAttr{SRQLimit: 2}, verbs.SRQLimit))
	sig := verbs.SendSignaled
	wrs := []*verbs.SendWR{
		{WRID: 1, Opcode: verbs.WRSend, Flags: sig, SG: []verbs.SGE{w.mrSrc.SGE(0, 3000)}},
		{WRID: 2, Opcode: verbs.WRRDMARead, Flags: sig, SG: []verbs.SGE{w.mrRecv.SGE(0x3000, 2000)},
			RemoteAddr: dgPeerVA, RKey: dgPeerRKey},
		{WRID: 3, Opcode: verbs.WRAtomicFetchAdd, Flags: sig, SG: []verbs.SGE{w.mrRecv.SGE(0x3800, 8)},
			RemoteAddr: dgPeerVA + 8, RKey: dgPeerRKey, CompareAdd: 5},
		{WRID: 4, Opcode: verbs.WRRDMAWrite, Flags: sig, SG: []verbs.SGE{w.mrSrc.SGE(0x1000, 100)},
			RemoteAddr: dgPeerVA + 0x100, RKey: dgPeerRKey},
		{WRID: 5, Opcode: verbs.WRAtomicCmpAndSwp, Flags: sig, SG: []verbs.SGE{w.mrRecv.SGE(0x3808, 8)},
			RemoteAddr: dgPeerVA + 16, RKey: dgPeerRKey, CompareAdd: 0, Swap: 9},
		{WRID: 6, Opcode: verbs.WRSendWithImm, Flags: sig | verbs.SendInline | verbs.SendSolicited,
			SG: []verbs.SGE{w.mrSrc.SGE(0x1800, 16)}, Imm: 0x11223344},
	}
	for _, wr := range wrs {
		must(a.PostSend(wr))
		in.sends[0] = append(in.sends[0], wr.WRID)
	}
	must(in.qps[1].PostSend(&verbs.SendWR{WRID: 0x21, Opcode: verbs.WRSend, Flags: sig, SG: []verbs.SGE{w.mrSrc.SGE(0, 64)}}))
	in.sends[1] = append(in.sends[1], 0x21)
	w.waitQuiet(t)
	out := w.sink.drain()
	if len(out) != 9 {
		t.Fatalf("set-up: %d packets sent, want 9", len(out))
	}
	for _, p := range out {
		putPacket(p)
	}
	return in
}

// tearDown destroys the input's QPs and SRQ; the device must be left with
// the objects it had before.
func (w *dgWorld) tearDown(t testing.TB, in *dgInput) {
	t.Helper()
	w.poll(t, in)
	for _, qp := range in.qps {
		if qp != nil {
			if err := qp.Close(); err != nil {
				t.Fatalf("destroy QP: %v", err)
			}
		}
	}
	if err := in.srq.Close(); err != nil {
		t.Fatalf("destroy SRQ: %v", err)
	}
	w.waitQuiet(t)
	for _, p := range w.sink.drain() {
		putPacket(p)
	}
	if o := w.d.Objects(); o != w.objs {
		t.Fatalf("objects after the input: %+v, before: %+v", o, w.objs)
	}
	if n := w.cqErrs.Load(); n > 0 {
		t.Fatalf("%d CQ overruns", n)
	}
}

// poll takes the completions and checks them: every one is of a work
// request that was posted and not completed yet; sends and receive-queue
// receives complete in order; after a send fails, the later ones fail too.
func (w *dgWorld) poll(t testing.TB, in *dgInput) {
	t.Helper()
	var wc [16]verbs.WorkCompletion
	for {
		n, err := w.scq.Poll(wc[:])
		if err != nil {
			t.Fatalf("poll the send CQ: %v", err)
		}
		for _, c := range wc[:n] {
			i := in.qpIndex(c.QPNum)
			if i < 0 || in.gotSend[i] >= len(in.sends[i]) || in.sends[i][in.gotSend[i]] != c.WRID {
				t.Fatalf("send completion %+v: not the next outstanding send of QP %d (completed %v of %v)", c, i, in.gotSend, in.sends)
			}
			if in.sendErr[i] && c.Status != verbs.WCWRFlushErr {
				t.Fatalf("send completion %+v after a failed send", c)
			}
			in.sendErr[i] = in.sendErr[i] || c.Status != verbs.WCSuccess
			in.gotSend[i]++
		}
		if n == 0 {
			break
		}
	}
	for {
		n, err := w.rcq.Poll(wc[:])
		if err != nil {
			t.Fatalf("poll the receive CQ: %v", err)
		}
		for _, c := range wc[:n] {
			i := in.qpIndex(c.QPNum)
			switch {
			case i < 0:
				t.Fatalf("receive completion %+v of no QP", c)
			case dgQPConfs[i].srq:
				if !in.srqWRs[c.WRID] {
					t.Fatalf("receive completion %+v: not an outstanding SRQ receive", c)
				}
				delete(in.srqWRs, c.WRID)
			default:
				if in.gotRecv[i] >= len(in.recvs[i]) || in.recvs[i][in.gotRecv[i]] != c.WRID {
					t.Fatalf("receive completion %+v: not the next outstanding receive", c)
				}
				in.gotRecv[i]++
			}
			if c.Status == verbs.WCSuccess {
				if c.ByteLen > in.recvLen[c.WRID] || c.Opcode != verbs.WCRecv && c.Opcode != verbs.WCRecvRDMAWithImm {
					t.Fatalf("receive completion %+v into a buffer of %d bytes", c, in.recvLen[c.WRID])
				}
			}
		}
		if n == 0 {
			break
		}
	}
}

// checkMemory checks that the device wrote nothing but the regions that
// allow it.
func (w *dgWorld) checkMemory(t testing.TB) {
	t.Helper()
	for _, r := range [][2]int{{0, offRemote}, {offRemote + lenRemote, offRecv}, {offRecv + lenRecv, dgBufSize}} {
		if !bytes.Equal(w.buf[r[0]:r[1]], w.init[r[0]:r[1]]) {
			i := r[0]
			for w.buf[i] == w.init[i] {
				i++
			}
			t.Fatalf("memory at offset %#x changed: %#x, was %#x", i, w.buf[i], w.init[i])
		}
	}
}

// qpSnap is what a QP's transport state is, to tell whether a packet
// changed it.
type qpSnap struct {
	gone                            bool
	state                           qpstate.State
	epsn, msn, off, rqTook          uint32
	nakSent, inMsg, hasRecv         bool
	resNext, reads                  int
	acked, high, psn, head, cwnd    uint32
	n, sendIdx, rdAtomic            int
	retries, rnrLeft                uint8
	rnrUntil, timerAt               instant
	wqes                            string
	cqPI, srqTaken, srqHead, srqLim uint32
}

// snapshot reads the transport state of the input's QPs and checks what
// must hold of it once the engine is quiet.
func (w *dgWorld) snapshot(t testing.TB, in *dgInput) [3]qpSnap {
	t.Helper()
	d := w.d
	d.mu.Lock()
	defer d.mu.Unlock()
	var s [3]qpSnap
	var pi uint32
	for _, c := range d.cqs {
		pi += c.pi
	}
	var sTaken, sHead, sLim uint32
	for _, x := range d.srqs {
		sTaken, sHead, sLim = uint32(x.taken), x.head, x.limit
	}
	if len(d.eng.readq) > 0 || len(d.eng.acks) > 0 || len(d.eng.runq) > 0 {
		t.Fatalf("engine quiet with work queued: %d QPs with READ responses, %d owing ACKs, %d to run",
			len(d.eng.readq), len(d.eng.acks), len(d.eng.runq))
	}
	for i, n := range in.nums {
		q := d.qps.get(n)
		if q == nil {
			s[i].gone = true
			continue
		}
		r := &q.req
		var wq []byte
		for _, x := range r.q {
			wq = fmt.Appendf(wq, "%d/%d/%d/%v/%v ", x.idx, x.sent, x.rdGot, x.rdGap, x.done)
		}
		s[i] = qpSnap{state: q.state, epsn: q.resp.epsn, msn: q.resp.msn, off: q.resp.off, rqTook: q.rqTook,
			nakSent: q.resp.nakSent, inMsg: q.resp.inMsg, hasRecv: q.resp.hasRecv,
			resNext: int(q.resp.resNext), reads: len(q.resp.reads),
			acked: r.acked, high: r.high, psn: r.psn, head: r.head, cwnd: r.cwnd,
			n: len(r.q), sendIdx: int(r.sendIdx), rdAtomic: int(r.rdAtomic), retries: r.retries, rnrLeft: r.rnrLeft,
			rnrUntil: r.rnrUntil, timerAt: r.timerAt, wqes: string(wq),
			cqPI: pi, srqTaken: sTaken, srqHead: sHead, srqLim: sLim}
		// Liveness: work outstanding on a QP that sends has a timer
		// that will retry it; READ responses owed are being sent.
		if (q.state == qpstate.RTS || q.state == qpstate.SQD) && len(r.q) > 0 &&
			(r.timerAt == 0 || r.heapIdx < 0 || int(r.heapIdx) >= len(d.eng.timers) || d.eng.timers[r.heapIdx] != q) {
			t.Fatalf("wedged: QP %d (%v) has %d requests outstanding and no timer", i, q.state, len(r.q))
		}
		if len(q.resp.reads) > 0 {
			t.Fatalf("wedged: QP %d owes READ responses the engine is not sending", i)
		}
		if r.sendIdx < 0 || int(r.sendIdx) > len(r.q) || r.rdAtomic < 0 || int(r.rdAtomic) > len(r.q) {
			t.Fatalf("QP %d requester: %d requests, next to send %d, %d READs and atomics outstanding", i, len(r.q), r.sendIdx, r.rdAtomic)
		}
		for _, x := range r.q {
			if x.rdGot > x.length || x.sent > x.npkts {
				t.Fatalf("QP %d request %d: %d of %d packets sent, %d of %d bytes read", i, x.idx, x.sent, x.npkts, x.rdGot, x.length)
			}
		}
	}
	return s
}

// counterValues reads the device's counters.
func (w *dgWorld) counters() []uint64 {
	var v []uint64
	w.d.counters.Each(func(_, _ string, x uint64) { v = append(v, x) })
	return v
}

// counter indexes in the order of Counters.Each.
var dgCounterIndex = func() map[string]int {
	m := map[string]int{}
	var c Counters
	c.Each(func(name, _ string, _ uint64) { m[name] = len(m) })
	return m
}()

func counterDiff(before, after []uint64) map[string]uint64 {
	out := map[string]uint64{}
	for name, i := range dgCounterIndex {
		if after[i] != before[i] {
			out[name] = after[i] - before[i]
		}
	}
	return out
}

// checkOut checks what the device sent: well-formed packets to the peer's
// QPs, no larger than their MTU, and nothing from a QP after the NAK that
// ends its life as a responder (responses go in order: a NAK overtaking
// the READ responses of an earlier request would tell the requester they
// were lost).
func (w *dgWorld) checkOut(t testing.TB, out []*roce.Packet) {
	t.Helper()
	nakked := map[uint32]bool{}
	for _, p := range out {
		if nakked[p.DestQP] {
			t.Fatalf("device sent %v PSN %#x to QP %#x after a fatal NAK", p.Opcode, p.PSN, p.DestQP)
		}
		if p.Opcode == roce.Acknowledge && p.Syndrome&roce.AETHKind == roce.AETHNak && p.Syndrome&0x1f != roce.NakPSNSeqErr {
			nakked[p.DestQP] = true
		}
		i := -1
		for j, c := range dgQPConfs {
			if p.DestQP == c.peerQPN {
				i = j
			}
		}
		if i < 0 || p.SrcGID != w.d.gid || p.DstGID != w.sink.gid || !p.Opcode.Valid() ||
			p.Opcode.Transport() != roce.TransportRC || len(p.Payload) > dgQPConfs[max(i, 0)].mtu.Bytes() {
			t.Fatalf("device sent %v to QP %#x, %d bytes of payload", p.Opcode, p.DestQP, len(p.Payload))
		}
		var q roce.Packet
		if err := roce.ParseTransport(p.AppendTransport(nil), &q); err != nil {
			t.Fatalf("device sent %v that does not decode: %v", p.Opcode, err)
		}
	}
}

// datagram builds the datagram of a record and the address it comes from.
func (w *dgWorld) datagram(in *dgInput, flags byte, body []byte) ([]byte, netip.AddrPort) {
	src := dgPeerAddr
	if flags&dgStranger != 0 {
		src = dgStrangerAddr
		if flags&dgIPv6 != 0 {
			src = dgStranger6
		}
	}
	from := netip.AddrPortFrom(src, dgSrcPort)
	b := append([]byte(nil), body...)
	tr := b
	if flags&dgRaw != 0 {
		tr = b[:max(0, len(b)-roce.ICRCLen)]
	}
	if len(tr) >= roce.BTHLen {
		if t := int(flags&dgTarget) >> 1; t < 3 {
			b[5], b[6], b[7] = byte(in.nums[t]>>16), byte(in.nums[t]>>8), byte(in.nums[t])
		}
		op := roce.Opcode(b[0])
		if flags&dgRelVA != 0 && op.Transport() == roce.TransportRC && (op.HasRETH() || op.HasAtomicETH()) &&
			len(tr) >= roce.BTHLen+8 {
			va := binary.BigEndian.Uint64(b[roce.BTHLen:])
			binary.BigEndian.PutUint64(b[roce.BTHLen:], va+uint64(unix.AddrOf(w.buf)))
		}
	}
	if flags&dgRaw == 0 {
		if len(b) >= roce.BTHLen {
			ip, udp := roce.PseudoHeaders(w.scratch.hdr[:], src, dgDevAddr, dgSrcPort, len(b))
			b = binary.LittleEndian.AppendUint32(b, roce.ICRC(ip, udp, b))
		} else {
			b = append(b, 0, 0, 0, 0) // too short to have an ICRC
		}
	}
	return b, from
}

// misdirected reports whether a packet is for none of the input's QPs (as
// the device must see it: an opcode of another transport, an unknown QP, a
// stranger's address).
func (w *dgWorld) misdirected(in *dgInput, p *roce.Packet) bool {
	return !p.Opcode.Valid() || p.Opcode.Transport() != roce.TransportRC || in.qpIndex(p.DestQP) < 0 ||
		p.SrcGID != w.sink.gid
}

// sendBurst sends the datagrams of a burst and checks how the device
// accounted for them.
func (w *dgWorld) sendBurst(t testing.TB, in *dgInput, burst [][]byte, flags []byte) {
	t.Helper()
	var ps []*roce.Packet
	var misdirected, requests, stray int
	before := w.snapshot(t, in)
	c0 := w.counters()
	for k, rec := range burst {
		b, from := w.datagram(in, flags[k], rec)
		c1 := w.counters()
		p := w.d.parseDatagram(b, from, &w.scratch, nil)
		c2 := w.counters()
		if p == nil {
			diff := counterDiff(c1, c2)
			// A bad ICRC counts in port_rcv_icrc_errors as well.
			if diff["port_rcv_errors"] != 1 || len(diff) != 1+int(diff["port_rcv_icrc_errors"]) || diff["port_rcv_icrc_errors"] > 1 {
				t.Fatalf("datagram %x rejected, counted %v", b, diff)
			}
			continue
		}
		switch i := in.qpIndex(p.DestQP); {
		case w.misdirected(in, p):
			misdirected++
		case p.Opcode.IsRequest():
			requests++
		case before[i].state != qpstate.RTS && before[i].state != qpstate.SQD,
			before[i].n == 0 && roce.PSNDiff(p.PSN, before[i].acked) > 0:
			stray++ // a response to a QP that is not sending, or to what it never sent
		}
		ps = append(ps, p)
	}
	c1 := w.counters()
	if len(ps) == 0 {
		return
	}
	w.d.eng.deliverAll(ps)
	ps = nil // the device owns them
	w.waitQuiet(t)
	out := w.sink.drain()
	defer func() {
		for _, p := range out {
			putPacket(p)
		}
	}()
	w.checkOut(t, out)
	after := w.snapshot(t, in)
	c2 := w.counters()
	diff := counterDiff(c1, c2)
	n := len(burst) - int(c1[dgCounterIndex["port_rcv_errors"]]-c0[dgCounterIndex["port_rcv_errors"]])
	if int(diff["port_rcv_packets"]) != n {
		t.Fatalf("%d packets delivered, port_rcv_packets rose by %d", n, diff["port_rcv_packets"])
	}
	if n == misdirected {
		// None was for a QP: each is counted, and none did anything.
		if int(diff["port_rcv_errors"]) != n || len(out) > 0 || after != before {
			t.Fatalf("%d misdirected packets: counted %v, %d packets sent, QPs %+v, were %+v", n, diff, len(out), after, before)
		}
		return
	}
	if n > 1 {
		return // what each did is not told apart
	}
	// One packet for a QP: it changed the QP, got an answer or was
	// counted.
	delete(diff, "port_rcv_packets")
	delete(diff, "port_rcv_data")
	if (requests == 1 || stray == 1) && len(diff) == 0 && len(out) == 0 && after == before {
		t.Fatalf("packet %x had no effect and was not counted", burst[len(burst)-1])
	}
}

// tick lets time pass until the device's next timer.
func (w *dgWorld) tick(t testing.TB, in *dgInput) {
	t.Helper()
	w.snapshot(t, in)
	if !w.clock.fire() {
		return
	}
	w.waitQuiet(t)
	out := w.sink.drain()
	w.checkOut(t, out)
	for _, p := range out {
		putPacket(p)
	}
}

// finish lets time pass until every send has completed: with the peer
// silent, the requester must give up after its retries. It fails if
// a send is still outstanding with no timer to end it.
func (w *dgWorld) finish(t testing.TB, in *dgInput) {
	t.Helper()
	for range 100 {
		w.poll(t, in)
		done := true
		for i := range in.sends {
			done = done && in.gotSend[i] == len(in.sends[i])
		}
		if done {
			return
		}
		w.snapshot(t, in) // work outstanding has its timer
		// Straight to the earliest requester timer: the engine's other
		// timer, which flushes receive queues of QPs in error, ticks
		// every millisecond.
		var next time.Time
		w.d.mu.Lock()
		for _, n := range in.nums {
			if q := w.d.qps.get(n); q != nil && q.req.timerAt != 0 {
				if at := w.d.eng.time(q.req.timerAt); next.IsZero() || at.Before(next) {
					next = at
				}
			}
		}
		w.d.mu.Unlock()
		w.clock.advance(next)
		if !w.clock.fire() {
			break
		}
		w.waitQuiet(t)
		out := w.sink.drain()
		w.checkOut(t, out)
		for _, p := range out {
			putPacket(p)
		}
	}
	t.Fatalf("wedged: sends outstanding after the retries: completed %v of %v", in.gotSend, in.sends)
}

// run plays one input. If it fails, the world is broken: the input may
// have left objects behind, or the device wedged.
func (w *dgWorld) run(t testing.TB, s []byte) {
	w.broken = true
	in := w.setUp(t)
	var burst [][]byte
	var flags []byte
	for k := 0; k < dgMaxRecords && len(s) >= 3; k++ {
		f, n := s[0], int(binary.LittleEndian.Uint16(s[1:]))
		s = s[3:]
		n = min(n, len(s))
		rec := s[:n]
		s = s[n:]
		if f&dgTick != 0 {
			if len(burst) > 0 {
				w.sendBurst(t, in, burst, flags)
				burst, flags = burst[:0], flags[:0]
			}
			w.tick(t, in)
			continue
		}
		burst, flags = append(burst, rec), append(flags, f)
		if f&dgBurst == 0 || len(s) < 3 || k == dgMaxRecords-1 {
			w.sendBurst(t, in, burst, flags)
			burst, flags = burst[:0], flags[:0]
		}
		for i, qp := range in.qps {
			a, _, err := qp.Query(verbs.QPAttrState)
			if err != nil {
				t.Fatalf("QUERY_QP of QP %d: %v", i, err)
			}
			if a.State < verbs.QPSReset || a.State > verbs.QPSErr {
				t.Fatalf("QP %d in state %v", i, a.State)
			}
		}
		w.poll(t, in)
		w.checkMemory(t)
	}
	w.finish(t, in)
	w.checkMemory(t)
	w.tearDown(t, in)
	w.broken = false
}

// dgScript builds fuzz inputs.
type dgScript []byte

func (s *dgScript) add(flags byte, b []byte) *dgScript {
	*s = append(*s, flags, byte(len(b)), byte(len(b)>>8))
	*s = append(*s, b...)
	return s
}

func (s *dgScript) tick() *dgScript { return s.add(dgTick, nil) }

// dgPacket encodes a packet's transport part.
func dgPacket(op roce.Opcode, psn uint32, fill func(p *roce.Packet)) []byte {
	p := roce.Packet{Opcode: op, PSN: psn, PKey: 0xffff}
	if op.IsLast() && op.IsRequest() {
		p.AckReq = true
	}
	if fill != nil {
		fill(&p)
	}
	return p.AppendTransport(nil)
}

func withPayload(n int) func(p *roce.Packet) {
	return func(p *roce.Packet) { p.Payload = bytes.Repeat([]byte{'P'}, n) }
}

func withRETH(va uint64, rkey, n uint32) func(p *roce.Packet) {
	return func(p *roce.Packet) { p.VA, p.RKey, p.DMALen = va, rkey, n }
}

// dgAnswerAll answers QP A's requests in order, as its peer would.
func dgAnswerAll() dgScript {
	var s dgScript
	s.add(0, dgPacket(roce.Acknowledge, 0x1236, nil))
	s.add(0, dgPacket(roce.ReadResponseFirst, 0x1237, func(p *roce.Packet) { p.Payload = bytes.Repeat([]byte{'R'}, 1024) }))
	s.add(0, dgPacket(roce.ReadResponseLast, 0x1238, func(p *roce.Packet) { p.Payload = bytes.Repeat([]byte{'R'}, 976) }))
	s.add(0, dgPacket(roce.AtomicAcknowledge, 0x1239, func(p *roce.Packet) { p.OrigData = 41 }))
	s.add(0, dgPacket(roce.Acknowledge, 0x123a, nil))
	s.add(0, dgPacket(roce.AtomicAcknowledge, 0x123b, nil))
	s.add(0, dgPacket(roce.Acknowledge, 0x123c, nil))
	return s
}

// dgSeeds are hand-made inputs: valid requests and responses for the QPs
// of an input, and sequences of them.
func dgSeeds(rkeyRemote, rkeyRO, rkeyOther uint32) []dgScript {
	const A, B, C = 0 << 1, 1 << 1, 2 << 1
	ack := func(psn uint32, syn uint8) []byte {
		return dgPacket(roce.Acknowledge, psn, func(p *roce.Packet) { p.Syndrome = syn })
	}
	readResp := func(op roce.Opcode, psn uint32, n int) []byte {
		return dgPacket(op, psn, func(p *roce.Packet) { p.Payload = bytes.Repeat([]byte{'R'}, n) })
	}
	atomicAck := func(psn uint32, orig uint64) []byte {
		return dgPacket(roce.AtomicAcknowledge, psn, func(p *roce.Packet) { p.OrigData = orig })
	}
	atomicReq := func(op roce.Opcode, psn uint32, va uint64, rkey uint32) []byte {
		return dgPacket(op, psn, func(p *roce.Packet) { p.VA, p.RKey, p.SwapAdd, p.Compare, p.AckReq = va, rkey, 3, 0, true })
	}
	var out []dgScript
	one := func(flags byte, b []byte) {
		var s dgScript
		s.add(flags, b)
		out = append(out, s)
	}
	// Responses for QP A's requests.
	one(A, ack(0x1236, roce.AETHAck))
	one(A, ack(0x123c, roce.AETHAck))
	one(A, ack(0x1235, roce.AETHNak|roce.NakPSNSeqErr))
	one(A, ack(0x1234, roce.AETHRNRNak|5))
	one(A, ack(0x1237, roce.AETHNak|roce.NakRemoteAccess))
	one(A, ack(0x1234, roce.AETHNak|roce.NakInvalidRequest))
	one(A, ack(0x1300, roce.AETHAck))
	one(A, readResp(roce.ReadResponseOnly, 0x1237, 16))
	one(A, atomicAck(0x1239, 7))
	one(B, ack(0x5678, roce.AETHAck))
	one(C, ack(0x9abc, roce.AETHAck))
	out = append(out, dgAnswerAll())
	{
		var s dgScript // a lost READ response, asked for again
		s.add(A, ack(0x1236, roce.AETHAck))
		s.add(A, readResp(roce.ReadResponseLast, 0x1238, 976))
		s.add(A, readResp(roce.ReadResponseFirst, 0x1237, 1024))
		s.tick()
		s.add(A, readResp(roce.ReadResponseLast, 0x1238, 976))
		out = append(out, s)
	}
	{
		var s dgScript // RNR wait, then retransmission
		s.add(A, ack(0x1234, roce.AETHRNRNak|1))
		s.tick()
		s.add(A, ack(0x1236, roce.AETHAck))
		out = append(out, s)
	}
	{
		var s dgScript // a timeout, then the ACK
		s.tick()
		s.add(A, ack(0x1236, roce.AETHAck))
		out = append(out, s)
	}
	{
		var s dgScript // ACK and responses in one round
		s.add(A|dgBurst, ack(0x1236, roce.AETHAck))
		s.add(A|dgBurst, readResp(roce.ReadResponseFirst, 0x1237, 1024))
		s.add(A, readResp(roce.ReadResponseLast, 0x1238, 976))
		out = append(out, s)
	}
	// Requests to QP A.
	one(A, dgPacket(roce.SendOnly, 0x1234, withPayload(100)))
	one(A, dgPacket(roce.SendOnlyImm, 0x1234, func(p *roce.Packet) { p.Payload, p.Imm, p.SE = []byte("hi"), 7, true }))
	one(A, dgPacket(roce.SendOnlyInv, 0x1234, withPayload(8)))
	{
		var s dgScript
		s.add(A, dgPacket(roce.SendFirst, 0x1234, withPayload(1024)))
		s.add(A, dgPacket(roce.SendLast, 0x1235, withPayload(500)))
		s.add(A, dgPacket(roce.SendOnly, 0x1235, withPayload(10))) // duplicate
		s.add(A, dgPacket(roce.SendOnlyImm, 0x1236, withPayload(2048)))
		out = append(out, s)
	}
	{
		var s dgScript // too long for the receive buffer
		s.add(A, dgPacket(roce.SendFirst, 0x1234, withPayload(1024)))
		s.add(A, dgPacket(roce.SendMiddle, 0x1235, withPayload(1024)))
		s.add(A, dgPacket(roce.SendLast, 0x1236, withPayload(1000)))
		out = append(out, s)
	}
	one(A|dgRelVA, dgPacket(roce.WriteOnly, 0x1234, func(p *roce.Packet) {
		p.VA, p.RKey, p.DMALen, p.Payload = offRemote+16, rkeyRemote, 64, bytes.Repeat([]byte{'W'}, 64)
	}))
	one(A|dgRelVA, dgPacket(roce.WriteOnlyImm, 0x1234, func(p *roce.Packet) {
		p.VA, p.RKey, p.DMALen, p.Payload, p.Imm = offRemote, rkeyRemote, 4, []byte("imm!"), 9
	}))
	{
		var s dgScript
		s.add(A|dgRelVA, dgPacket(roce.WriteFirst, 0x1234, func(p *roce.Packet) {
			p.VA, p.RKey, p.DMALen, p.Payload = offRemote+100, rkeyRemote, 1500, bytes.Repeat([]byte{'F'}, 1024)
		}))
		s.add(A, dgPacket(roce.WriteLast, 0x1235, withPayload(476)))
		out = append(out, s)
	}
	one(A|dgRelVA, dgPacket(roce.WriteOnly, 0x1234, func(p *roce.Packet) { // beyond the region
		p.VA, p.RKey, p.DMALen, p.Payload = offRemote+lenRemote-8, rkeyRemote, 16, bytes.Repeat([]byte{'X'}, 16)
	}))
	one(A|dgRelVA, dgPacket(roce.WriteOnly, 0x1234, func(p *roce.Packet) { // not writable
		p.VA, p.RKey, p.DMALen, p.Payload = offRO, rkeyRO, 16, bytes.Repeat([]byte{'X'}, 16)
	}))
	one(A|dgRelVA, dgPacket(roce.WriteOnly, 0x1234, func(p *roce.Packet) { // another PD
		p.VA, p.RKey, p.DMALen, p.Payload = offOther, rkeyOther, 16, bytes.Repeat([]byte{'X'}, 16)
	}))
	one(A|dgRelVA, dgPacket(roce.ReadRequest, 0x1234, withRETH(offRemote, rkeyRemote, 3000)))
	one(A|dgRelVA, dgPacket(roce.ReadRequest, 0x1234, withRETH(offRO+8, rkeyRO, 100)))
	one(A, dgPacket(roce.ReadRequest, 0x1234, withRETH(0, 0, 0)))
	{
		var s dgScript // a READ, then the same READ again
		s.add(A|dgRelVA, dgPacket(roce.ReadRequest, 0x1234, withRETH(offRemote, rkeyRemote, 2048)))
		s.add(A|dgRelVA, dgPacket(roce.ReadRequest, 0x1234, withRETH(offRemote, rkeyRemote, 2048)))
		s.add(A|dgRelVA, dgPacket(roce.ReadRequest, 0x1235, withRETH(offRemote+1024, rkeyRemote, 1024)))
		out = append(out, s)
	}
	one(A|dgRelVA, atomicReq(roce.FetchAdd, 0x1234, offRemote+8, rkeyRemote))
	one(A|dgRelVA, atomicReq(roce.CompareSwap, 0x1234, offRemote+16, rkeyRemote))
	one(A|dgRelVA, atomicReq(roce.FetchAdd, 0x1234, offRemote+3, rkeyRemote))
	{
		var s dgScript // an atomic, then its duplicate
		s.add(A|dgRelVA, atomicReq(roce.FetchAdd, 0x1234, offRemote+8, rkeyRemote))
		s.add(A|dgRelVA, atomicReq(roce.FetchAdd, 0x1234, offRemote+8, rkeyRemote))
		out = append(out, s)
	}
	one(A, dgPacket(roce.SendOnly, 0x1240, withPayload(8))) // out of sequence
	{
		var s dgScript // a READ, and in the same round a WRITE that fails
		s.add(A|dgRelVA|dgBurst, dgPacket(roce.ReadRequest, 0x1234, withRETH(offRemote, rkeyRemote, 2048)))
		s.add(A|dgRelVA, dgPacket(roce.WriteOnly, 0x1236, func(p *roce.Packet) {
			p.VA, p.RKey, p.DMALen, p.Payload = offRO, rkeyRO, 16, bytes.Repeat([]byte{'X'}, 16)
		}))
		out = append(out, s)
	}
	{
		var s dgScript // several requests in one round
		s.add(A|dgBurst, dgPacket(roce.SendOnly, 0x1234, withPayload(8)))
		s.add(A|dgRelVA|dgBurst, dgPacket(roce.ReadRequest, 0x1235, withRETH(offRemote, rkeyRemote, 4096)))
		s.add(A, dgPacket(roce.SendFirst, 0x1239, withPayload(1024)))
		out = append(out, s)
	}
	// Requests to QP B (SRQ, write only, MTU 256) and C (RTR, no receives).
	{
		var s dgScript
		for i := range 5 {
			s.add(B, dgPacket(roce.SendOnly, 0x5678+uint32(i), withPayload(200)))
		}
		out = append(out, s)
	}
	one(B|dgRelVA, dgPacket(roce.WriteOnly, 0x5678, func(p *roce.Packet) {
		p.VA, p.RKey, p.DMALen, p.Payload = offRemote, rkeyRemote, 256, bytes.Repeat([]byte{'B'}, 256)
	}))
	one(B|dgRelVA, dgPacket(roce.ReadRequest, 0x5678, withRETH(offRemote, rkeyRemote, 8)))
	one(C, dgPacket(roce.SendOnly, 0x9abc, withPayload(8)))
	one(C|dgRelVA, dgPacket(roce.ReadRequest, 0x9abc, withRETH(offRemote, rkeyRemote, 8192)))
	one(C|dgRelVA, atomicReq(roce.CompareSwap, 0x9abc, offRemote, rkeyRemote))
	one(C|dgRelVA, dgPacket(roce.WriteOnly, 0x9abc, func(p *roce.Packet) {
		p.VA, p.RKey, p.DMALen, p.Payload = offRemote, rkeyRemote, 4, []byte("nope")
	}))
	// What the device must drop.
	one(A|dgStranger, dgPacket(roce.SendOnly, 0x1234, withPayload(8)))
	one(A|dgStranger|dgIPv6, ack(0x1236, roce.AETHAck))
	one(dgTarget, dgPacket(roce.SendOnly, 0x1234, func(p *roce.Packet) { p.DestQP = 0x123456 }))
	one(A, dgPacket(roce.TransportUD|roce.SendOnly, 0x1234, func(p *roce.Packet) { p.QKey, p.SrcQP = 1, 2 }))
	one(A, dgPacket(roce.TransportUC|roce.SendOnly, 0x1234, withPayload(4)))
	one(A|dgRaw, append(dgPacket(roce.SendOnly, 0x1234, withPayload(8)), 1, 2, 3, 4))
	one(A, dgPacket(roce.SendOnly, 0x1234, withPayload(5000)))
	one(A, []byte{0x04, 0, 0xff, 0xff})
	return out
}

// readPcap returns the transport parts (without ICRC) of the RoCEv2
// packets of an Ethernet pcap file.
func readPcap(tb testing.TB, path string) [][]byte {
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Logf("capture not available: %v", err)
		return nil
	}
	if len(b) < 24 || binary.LittleEndian.Uint32(b) != 0xa1b2c3d4 || binary.LittleEndian.Uint32(b[20:]) != 1 {
		tb.Fatalf("%s: not a little-endian Ethernet pcap", path)
	}
	var out [][]byte
	for off := 24; off+16 <= len(b); {
		incl := int(binary.LittleEndian.Uint32(b[off+8:]))
		frame := b[off+16 : off+16+incl]
		off += 16 + incl
		eth := 14
		etype := binary.BigEndian.Uint16(frame[12:])
		if etype == 0x8100 {
			eth, etype = 18, binary.BigEndian.Uint16(frame[16:])
		}
		var ipLen int
		switch {
		case etype == 0x0800 && frame[eth+9] == 17:
			ipLen = int(frame[eth]&0xf) * 4
		case etype == 0x86dd && frame[eth+6] == 17:
			ipLen = 40
		default:
			continue
		}
		udp := frame[eth+ipLen:]
		if binary.BigEndian.Uint16(udp[2:]) != roce.UDPPort {
			continue
		}
		n := int(binary.BigEndian.Uint16(udp[4:]))
		out = append(out, slices.Clone(udp[8:n-roce.ICRCLen]))
	}
	return out
}

const dgCapture = "../../shared/testdata/rxe-roce-linux6.1.pcap"

func FuzzDatagram(f *testing.F) {
	w := newDGWorld(f)
	f.Cleanup(func() { w.close() })
	for _, s := range dgSeeds(w.mrRemote.RKey(), w.mrRO.RKey(), w.mrOther.RKey()) {
		f.Add([]byte(s))
	}
	// The packets Linux's Soft-RoCE sent, to each QP, and as they were.
	for i, tr := range readPcap(f, dgCapture) {
		var s dgScript
		s.add(byte(i%3)<<1, tr)
		f.Add([]byte(s))
		if i%8 == 0 {
			s = s[:0]
			s.add(dgTarget, tr)
			f.Add([]byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, s []byte) {
		if w.broken {
			// Start over on a new device, so that a failure is the
			// input's own when the fuzzer runs it again to minimize
			// it. The old one may be wedged: leave it.
			w = newDGWorld(t)
		}
		w.run(t, s)
	})
}

// TestDatagramSeeds checks that the seeds reach what they are made for:
// answered in order, QP A's requests all succeed, with the data of the
// READ and the atomic's result in memory.
func TestDatagramSeeds(t *testing.T) {
	w := newDGWorld(t)
	defer w.close()
	in := w.setUp(t)
	for s := dgAnswerAll(); len(s) > 0; {
		n := int(binary.LittleEndian.Uint16(s[1:]))
		w.sendBurst(t, in, [][]byte{s[3 : 3+n]}, []byte{s[0]})
		s = s[3+n:]
	}
	w.poll(t, in)
	if in.gotSend[0] != 6 || in.sendErr[0] {
		t.Fatalf("QP A: %d of its 6 sends completed (errors: %v)", in.gotSend[0], in.sendErr[0])
	}
	if got := binary.NativeEndian.Uint64(w.buf[offRecv+0x3800:]); got != 41 {
		t.Errorf("FETCH_ADD result %d, want 41", got)
	}
	if !bytes.Equal(w.buf[offRecv+0x3000:offRecv+0x3000+2000], bytes.Repeat([]byte{'R'}, 2000)) {
		t.Errorf("READ result not in memory")
	}
	w.finish(t, in)
	w.tearDown(t, in)
}
