package verbstest

import (
	"syscall"
	"testing"

	"github.com/xrcrun/xrc/verbs"
)

// testClosedObjects: an object used after its Close fails with
// verbs.ErrClosed instead of reaching memory the Close freed (the rings
// and doorbell records, which the next object may be given) or a handle
// that may name another object by now; a CQ is not made on a closed
// channel, nor a QP of one context on another's CQ.
func testClosedObjects(t *testing.T, env Env) {
	ca, cb := env.Open(t)
	s := newSide(t, ca, defaultOpts(), nil)
	o := defaultOpts()

	armCh, err := ca.CreateCompChannel()
	check(t, err)
	t.Cleanup(func() { check(t, armCh.Close()) })
	cq, err := ca.CreateCQ(8, armCh, 0)
	check(t, err)
	check(t, cq.Close())
	_, err = cq.Poll(make([]verbs.WorkCompletion, 1))
	expectErrno(t, err, verbs.ErrClosed, "poll a closed CQ")
	expectErrno(t, cq.RequestNotify(false), verbs.ErrClosed, "arm a closed CQ")

	qp, err := s.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: s.cq, RecvCQ: s.cq, Cap: o.cap})
	check(t, err)
	check(t, qp.Close())
	expectErrno(t, qp.PostSend(&verbs.SendWR{Opcode: verbs.WRSend}), verbs.ErrClosed, "post a send to a closed QP")
	expectErrno(t, qp.PostRecv(&verbs.RecvWR{}), verbs.ErrClosed, "post a receive to a closed QP")

	srq, err := s.pd.CreateSRQ(verbs.SRQAttr{MaxWR: 8, MaxSGE: 1})
	check(t, err)
	check(t, srq.Close())
	expectErrno(t, srq.PostRecv(&verbs.RecvWR{}), verbs.ErrClosed, "post a receive to a closed SRQ")

	ch, err := ca.CreateCompChannel()
	check(t, err)
	check(t, ch.Close())
	_, err = ca.CreateCQ(8, ch, 0)
	expectErrno(t, err, verbs.ErrClosed, "create a CQ on a closed channel")

	pd, err := ca.AllocPD()
	check(t, err)
	check(t, pd.Close())
	_, err = pd.RegMR(s.buf, verbs.AccessLocalWrite)
	expectErrno(t, err, verbs.ErrClosed, "register memory in a closed PD")
	_, err = pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: s.cq, RecvCQ: s.cq, Cap: o.cap})
	expectErrno(t, err, verbs.ErrClosed, "create a QP in a closed PD")
	_, err = s.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: cq, RecvCQ: s.cq, Cap: o.cap})
	expectErrno(t, err, verbs.ErrClosed, "create a QP on a closed CQ")

	if ca != cb {
		other, err := cb.CreateCQ(8, nil, 0)
		check(t, err)
		defer func() { check(t, other.Close()) }()
		_, err = s.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: other, RecvCQ: other, Cap: o.cap})
		expectErrno(t, err, syscall.EINVAL, "create a QP on another context's CQ")
		_, err = cb.CreateCQ(8, func() *verbs.CompChannel {
			ch, err := ca.CreateCompChannel()
			check(t, err)
			t.Cleanup(func() { check(t, ch.Close()) })
			return ch
		}(), 0)
		expectErrno(t, err, syscall.EINVAL, "create a CQ on another context's channel")
	}
}
