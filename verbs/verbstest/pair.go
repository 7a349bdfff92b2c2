// Package verbstest is the verbs conformance suite: one set of tests of the
// verbs API that runs against every kind of device available (software HCAs
// in process and out of process, and real hardware where present), so that
// they all behave the same.
//
// A device kind plugs in as an Env; Run runs the whole suite on it.
package verbstest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/xrcrun/xrc/verbs"
)

// Env opens the devices the suite runs on.
type Env struct {
	// Name describes the environment in test names.
	Name string
	// Open returns two contexts: the requester's side and the responder's
	// side of the connections the tests make. They may be the same device
	// or two devices that reach each other. The suite closes them.
	Open func(t testing.TB) (a, b *verbs.Context)
}

// PollTimeout bounds how long the suite waits for a completion that should
// come; it is a guard against hangs, not a measure of speed.
var PollTimeout = 30 * time.Second

// side is one end of a connection: a context and the objects a test uses.
type side struct {
	t    testing.TB
	ctx  *verbs.Context
	port verbs.PortAttr
	pd   *verbs.PD
	cq   *verbs.CQ
	buf  []byte
	mr   *verbs.MR
	qp   *verbs.QP
}

// pairOpts configure a connected pair.
type pairOpts struct {
	mrAccess  verbs.Access // access of both sides' buffers
	qpAccess  verbs.Access // access flags of the QPs
	bufSize   int
	mtu       verbs.MTU
	cap       verbs.QPCap
	srq       bool // the responder's QP takes receives from an SRQ
	rnrRetry  uint8
	minRNR    uint8
	timeout   uint8
	retryCnt  uint8
	noConnect bool // create the QPs but leave them in RESET
	channel   bool // give the CQs a completion channel
	sigAll    bool
	psn       uint32 // the first PSN both ways
}

func defaultOpts() pairOpts {
	return pairOpts{
		mrAccess: verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic,
		qpAccess: verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic,
		bufSize:  1 << 20,
		mtu:      verbs.MTU1024,
		cap:      verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 128},
		rnrRetry: 7,
		minRNR:   1,
		timeout:  14,
		retryCnt: 7,
		psn:      0x1234,
	}
}

// pair is a connected RC QP pair: a sends, b responds.
type pair struct {
	a, b *side
	srq  *verbs.SRQ
	ch   [2]*verbs.CompChannel
}

func newSide(t testing.TB, ctx *verbs.Context, o pairOpts, ch *verbs.CompChannel) *side {
	t.Helper()
	s := &side{t: t, ctx: ctx}
	var err error
	if s.port, err = ctx.QueryPort(1); err != nil {
		t.Fatal(err)
	}
	if s.pd, err = ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, s.pd.Close()) })
	if s.cq, err = ctx.CreateCQ(256, ch, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, s.cq.Close()) })
	if s.buf, err = verbs.Alloc(o.bufSize); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, verbs.Free(s.buf)) })
	if s.mr, err = s.pd.RegMR(s.buf, o.mrAccess); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check(t, s.mr.Close()) })
	return s
}

func check(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Error(err)
	}
}

func (s *side) createQP(o pairOpts, srq *verbs.SRQ) {
	s.t.Helper()
	var err error
	s.qp, err = s.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: s.cq, RecvCQ: s.cq, SRQ: srq, Cap: o.cap, SigAll: o.sigAll})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { check(s.t, s.qp.Close()) })
}

// newPair builds a connected pair on env's devices.
func newPair(t testing.TB, env Env, o pairOpts) *pair {
	t.Helper()
	ca, cb := env.Open(t)
	p := &pair{}
	if o.channel {
		for i, c := range []*verbs.Context{ca, cb} {
			ch, err := c.CreateCompChannel()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { check(t, ch.Close()) })
			p.ch[i] = ch
		}
	}
	p.a = newSide(t, ca, o, p.ch[0])
	p.b = newSide(t, cb, o, p.ch[1])
	if o.srq {
		var err error
		p.srq, err = p.b.pd.CreateSRQ(verbs.SRQAttr{MaxWR: 64, MaxSGE: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { check(t, p.srq.Close()) })
	}
	p.a.createQP(o, nil)
	p.b.createQP(o, p.srq)
	if !o.noConnect {
		connect(t, p.a, p.b, o)
		connect(t, p.b, p.a, o)
	}
	return p
}

// connect brings s's QP to RTS toward peer's.
func connect(t testing.TB, s, peer *side, o pairOpts) {
	t.Helper()
	connectTo(t, s, peer.port.GID, peer.qp.Num(), o)
}

// connectTo brings s's QP to RTS toward QP qpn on the port of gid, through
// INIT and RTR with exactly the attributes each transition requires.
func connectTo(t testing.TB, s *side, gid verbs.GID, qpn uint32, o pairOpts) {
	t.Helper()
	steps := []struct {
		attr verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: o.qpAccess},
			verbs.QPAttrState | verbs.QPAttrPkeyIndex | verbs.QPAttrPort | verbs.QPAttrAccessFlags},
		{verbs.QPAttr{State: verbs.QPSRTR, PathMTU: o.mtu, DestQPN: qpn, RQPSN: o.psn,
			MaxDestRdAtomic: 4, MinRNRTimer: o.minRNR,
			AH: verbs.AHAttr{IsGlobal: true, Port: 1, GRH: verbs.GlobalRoute{DGID: gid, HopLimit: 64}}},
			verbs.QPAttrState | verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN |
				verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer},
		{verbs.QPAttr{State: verbs.QPSRTS, Timeout: o.timeout, RetryCnt: o.retryCnt, RNRRetry: o.rnrRetry,
			SQPSN: o.psn, MaxRdAtomic: 4},
			verbs.QPAttrState | verbs.QPAttrTimeout | verbs.QPAttrRetryCnt | verbs.QPAttrRNRRetry |
				verbs.QPAttrSQPSN | verbs.QPAttrMaxQPRdAtomic},
	}
	for _, st := range steps {
		if err := s.qp.Modify(&st.attr, st.mask); err != nil {
			t.Fatalf("connect: %v", err)
		}
	}
}

// poll waits for n completions on cq.
func poll(t testing.TB, cq *verbs.CQ, n int) []verbs.WorkCompletion {
	t.Helper()
	wc := make([]verbs.WorkCompletion, n)
	got := 0
	deadline := time.Now().Add(PollTimeout)
	for got < n {
		k, err := cq.Poll(wc[got:])
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		got += k
		if k == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("poll: %d of %d completions after %v", got, n, PollTimeout)
			}
			time.Sleep(10 * time.Microsecond)
		}
	}
	return wc
}

// pollOne waits for one completion and checks its status and wr_id.
func pollOne(t testing.TB, cq *verbs.CQ, status verbs.WCStatus, wrid uint64) verbs.WorkCompletion {
	t.Helper()
	wc := poll(t, cq, 1)[0]
	if wc.Status != status || wc.WRID != wrid {
		t.Fatalf("completion %+v, want status %v wr_id %d", wc, status, wrid)
	}
	return wc
}

// noCompletion checks that cq stays empty for a while.
func noCompletion(t testing.TB, cq *verbs.CQ, wait time.Duration) {
	t.Helper()
	wc := make([]verbs.WorkCompletion, 1)
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		n, err := cq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			t.Fatalf("unexpected completion %+v", wc[0])
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func waitState(t testing.TB, qp *verbs.QP, want verbs.QPState) {
	t.Helper()
	deadline := time.Now().Add(PollTimeout)
	for {
		a, _, err := qp.Query(verbs.QPAttrState)
		if err != nil {
			t.Fatal(err)
		}
		if a.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("QP in %v, want %v", a.State, want)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>8) + byte(i>>16)*29 // no period below 16 MiB
	}
}

func expectErrno(t testing.TB, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got %v, want an error matching %v", what, err, target)
	}
}

func waitAsync(t testing.TB, c *verbs.Context, typ verbs.EventType) verbs.AsyncEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), PollTimeout)
	defer cancel()
	for {
		ev, err := c.GetAsyncEvent(ctx)
		if err != nil {
			t.Fatalf("waiting for %v: %v", typ, err)
		}
		if ev.Type == typ {
			return ev
		}
	}
}

// Endpoint is one side of a connected pair, for benchmarks and tests
// outside this package.
type Endpoint struct {
	Ctx *verbs.Context
	PD  *verbs.PD
	CQ  *verbs.CQ
	Buf []byte // registered with MR, bufSize bytes
	MR  *verbs.MR
	QP  *verbs.QP
}

// Options change the defaults of ConnectWith; zero fields keep them.
type Options struct {
	MTU      verbs.MTU // path MTU (default 1024)
	Timeout  uint8     // the QPs' transport timeout (default 14: 67 ms)
	RetryCnt uint8     // default 7
	Channel  bool      // give the CQs a completion channel (CQ.Channel)
}

// Connect makes a connected RC pair on env, each side with a registered
// buffer of bufSize bytes (all access rights) and a 256-entry CQ. Its QPs
// take 64 outstanding requests each way.
func Connect(tb testing.TB, env Env, bufSize int) (a, b Endpoint) {
	tb.Helper()
	return ConnectWith(tb, env, bufSize, Options{})
}

// ConnectWith is Connect with other QP attributes.
func ConnectWith(tb testing.TB, env Env, bufSize int, opt Options) (a, b Endpoint) {
	tb.Helper()
	o := opt.opts()
	o.bufSize = bufSize
	p := newPair(tb, env, o)
	ep := func(s *side) Endpoint {
		return Endpoint{Ctx: s.ctx, PD: s.pd, CQ: s.cq, Buf: s.buf, MR: s.mr, QP: s.qp}
	}
	return ep(p.a), ep(p.b)
}

// opts is the defaults with opt's non-zero fields.
func (opt Options) opts() pairOpts {
	o := defaultOpts()
	if opt.MTU != 0 {
		o.mtu = opt.MTU
	}
	if opt.Timeout != 0 {
		o.timeout = opt.Timeout
	}
	if opt.RetryCnt != 0 {
		o.retryCnt = opt.RetryCnt
	}
	o.channel = opt.Channel
	return o
}

// BringUp takes an RC QP from RESET to RTS toward QP qpn on the port with
// GID gid, with the suite's default attributes.
func BringUp(tb testing.TB, qp *verbs.QP, gid verbs.GID, qpn uint32) {
	tb.Helper()
	BringUpWith(tb, qp, gid, qpn, Options{})
}

// BringUpWith is BringUp with other QP attributes (Channel does not
// apply).
func BringUpWith(tb testing.TB, qp *verbs.QP, gid verbs.GID, qpn uint32, opt Options) {
	tb.Helper()
	connectTo(tb, &side{qp: qp}, gid, qpn, opt.opts())
}
