package verbs

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
	"syscall"

	"github.com/xrcrun/xrc/internal/qpstate"
)

// SRQ is a shared receive queue: receive buffers shared by the QPs attached
// to it.
type SRQ struct {
	pd     *PD
	xrcd   *XRCD // the domain of an XRC SRQ, else nil
	ops    ProviderSRQ
	handle uint64
	life   lifecycle
}

// CreateSRQ creates an SRQ of at least attr.MaxWR receive requests of
// attr.MaxSGE entries. As in ibverbs, attr.SRQLimit is not armed at
// creation: arm the limit event with Modify.
func (pd *PD) CreateSRQ(attr SRQAttr) (*SRQ, error) {
	if attr.MaxWR == 0 || attr.MaxSGE == 0 {
		return nil, fmt.Errorf("create srq: max_wr and max_sge must not be 0: %w", syscall.EINVAL)
	}
	if err := pd.life.alive(); err != nil {
		return nil, fmt.Errorf("create srq: %w", err)
	}
	c := pd.ctx
	h, err := c.register()
	if err != nil {
		return nil, fmt.Errorf("create srq: %w", err)
	}
	ops, err := pd.ops.CreateSRQ(SRQInit{Attr: attr, Handle: h})
	if err != nil {
		c.unregister(h)
		return nil, fmt.Errorf("create srq: %w", err)
	}
	srq := &SRQ{pd: pd, ops: ops, handle: h}
	c.publish(h, srq)
	return srq, nil
}

// PostRecv posts receive requests (wr and those chained by Next). On error,
// the requests before the one at fault were posted; the error is a
// *PostError naming it.
func (s *SRQ) PostRecv(wr *RecvWR) error { return s.ops.PostRecv(wr) }

// Modify arms the limit event (SRQLimit) or resizes the SRQ (SRQMaxWR,
// where the device supports it).
func (s *SRQ) Modify(attr SRQAttr, mask SRQAttrMask) error {
	if mask&SRQMaxWR != 0 {
		if err := s.pd.ctx.Supports(FeatureSRQResize); err != nil {
			return fmt.Errorf("modify srq: %w", err)
		}
	}
	if err := s.ops.Modify(attr, mask); err != nil {
		return fmt.Errorf("modify srq: %w", err)
	}
	return nil
}

// Query reports the SRQ's attributes.
func (s *SRQ) Query() (SRQAttr, error) {
	a, err := s.ops.Query()
	if err != nil {
		return a, fmt.Errorf("query srq: %w", err)
	}
	return a, nil
}

// Num is the SRQ number.
func (s *SRQ) Num() uint32 { return s.ops.Num() }

// Close destroys the SRQ. It fails with an error wrapping EBUSY while QPs
// use it.
func (s *SRQ) Close() error {
	return s.life.close(func() error {
		if err := s.ops.Destroy(); err != nil {
			return fmt.Errorf("destroy srq: %w", err)
		}
		if s.xrcd != nil {
			s.xrcd.users.Add(-1)
		}
		s.pd.ctx.unregister(s.handle)
		return nil
	})
}

// PostError is returned by the post functions: the request at Index (0 for
// the first of the chain) was not posted, nor were those after it.
type PostError struct {
	Index int
	Err   error
}

func (e *PostError) Error() string { return fmt.Sprintf("work request %d: %v", e.Index, e.Err) }
func (e *PostError) Unwrap() error { return e.Err }

// QP is a queue pair.
type QP struct {
	// ops first: posting reads nothing else of the QP, and at the start
	// of the object it never straddles two cache lines.
	ops    ProviderQP
	ctx    *Context
	pd     *PD   // nil for XRC receive QPs
	xrcd   *XRCD // the domain of an XRC receive QP, else nil
	typ    QPType
	handle uint64
	life   lifecycle

	mu    sync.Mutex
	state QPState // guarded by mu: the state after the last successful Modify
}

// CreateQP creates a QP in the RESET state. RC, UC and UD QPs need a send
// and a receive CQ. An XRC send QP (QPTXRCIni, where the device supports
// FeatureXRC) needs a send CQ and has no receive queue: RecvCQ, SRQ and the
// receive capabilities must be left empty. XRC receive QPs are made by
// XRCD.CreateTgtQP.
func (pd *PD) CreateQP(attr *QPInitAttr) (*QP, error) {
	c := pd.ctx
	switch attr.Type {
	case QPTRC, QPTUC, QPTUD:
		if attr.SendCQ == nil || attr.RecvCQ == nil {
			return nil, fmt.Errorf("create qp: %v QP needs a send CQ and a receive CQ: %w", attr.Type, syscall.EINVAL)
		}
		if attr.SRQ != nil && attr.SRQ.xrcd != nil {
			return nil, fmt.Errorf("create qp: an XRC SRQ serves XRC receive QPs only: %w", syscall.EINVAL)
		}
	case QPTXRCIni:
		if err := c.Supports(FeatureXRC); err != nil {
			return nil, fmt.Errorf("create qp: %w", err)
		}
		if attr.SendCQ == nil {
			return nil, fmt.Errorf("create qp: XRC_INI QP needs a send CQ: %w", syscall.EINVAL)
		}
		if attr.RecvCQ != nil || attr.SRQ != nil || attr.Cap.MaxRecvWR != 0 || attr.Cap.MaxRecvSGE != 0 {
			return nil, fmt.Errorf("create qp: XRC_INI QP has no receive queue (no receive CQ, SRQ or receive capabilities): %w", syscall.EINVAL)
		}
	case QPTXRCTgt:
		return nil, fmt.Errorf("create qp: XRC_TGT QPs belong to a domain: use XRCD.CreateTgtQP: %w", syscall.EINVAL)
	default:
		return nil, fmt.Errorf("create qp: type %v: %w", attr.Type, ErrNotSupported)
	}
	if attr.SendCQ.ctx != c || (attr.RecvCQ != nil && attr.RecvCQ.ctx != c) || (attr.SRQ != nil && attr.SRQ.pd.ctx != c) {
		// The provider would pass another context's handles, which name
		// other objects (or none) in this one.
		return nil, fmt.Errorf("create qp: CQs, SRQ and PD of different contexts: %w", syscall.EINVAL)
	}
	if err := cmp.Or(pd.life.alive(), attr.SendCQ.alive(), attr.RecvCQ.alive(), attr.SRQ.alive()); err != nil {
		return nil, fmt.Errorf("create qp: its PD, CQs or SRQ: %w", err)
	}
	h, err := c.register()
	if err != nil {
		return nil, fmt.Errorf("create qp: %w", err)
	}
	init := QPInit{Type: attr.Type, SendCQ: attr.SendCQ.ops, Cap: attr.Cap, SigAll: attr.SigAll, Handle: h}
	if attr.RecvCQ != nil {
		init.RecvCQ = attr.RecvCQ.ops
	}
	if attr.SRQ != nil {
		init.SRQ = attr.SRQ.ops
	}
	ops, err := pd.ops.CreateQP(init)
	if err != nil {
		c.unregister(h)
		return nil, fmt.Errorf("create %v qp: %w", attr.Type, err)
	}
	var qp *QP
	if home, ok := ops.(QPHome); ok {
		qp = home.VerbsQP()
	} else {
		qp = new(QP)
	}
	qp.ctx, qp.pd, qp.ops, qp.typ, qp.handle, qp.state = c, pd, ops, attr.Type, h, QPSReset
	c.publish(h, qp)
	return qp, nil
}

// QPHome is implemented by a provider's QP made by ProviderPD.CreateQP that
// holds the QP of this package in its own object, as rdma-core's providers
// embed struct verbs_qp in theirs: CreateQP then uses that QP, which must
// be zero and is the provider QP's own for as long as it lives, and a post
// reads one object instead of two (with thousands of QPs, a cache miss
// each). The provider should put it where its posting reads, so that
// QP.ops shares a cache line with what PostSend uses.
type QPHome interface {
	VerbsQP() *QP
}

// Num is the QP number.
func (qp *QP) Num() uint32 { return qp.ops.Num() }

// Type is the QP's transport type.
func (qp *QP) Type() QPType { return qp.typ }

// Cap is the QP's actual queue sizes.
func (qp *QP) Cap() QPCap { return qp.ops.Cap() }

// PostSend posts send requests (wr and those chained by Next). On error,
// the requests before the one at fault were posted; the error is a
// *PostError naming it.
func (qp *QP) PostSend(wr *SendWR) error { return qp.ops.PostSend(wr) }

// PostRecv posts receive requests. On error, the error is a *PostError.
func (qp *QP) PostRecv(wr *RecvWR) error { return qp.ops.PostRecv(wr) }

// Modify changes the QP's attributes selected by mask. A state change
// (QPAttrState) must follow the IB state machine and give exactly the
// attributes the transition requires, plus optional ones it allows;
// otherwise Modify returns a *TransitionError naming what is missing or not
// allowed (it also matches syscall.EINVAL).
func (qp *QP) Modify(attr *QPAttr, mask QPAttrMask) error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	check := func(cur QPState) error {
		if mask&QPAttrCurState != 0 {
			cur = attr.CurState
		}
		next := cur
		if mask&QPAttrState != 0 {
			next = attr.State
		}
		return qpstate.Check(qp.typ, cur, next, mask)
	}
	err := check(qp.state)
	if err != nil {
		// The device may have moved the QP (to ERR, say) since our last
		// Modify: judge against its real state before refusing.
		if cur, qerr := qp.queryState(); qerr == nil && cur != qp.state {
			qp.state = cur
			err = check(cur)
		}
		if err != nil {
			return fmt.Errorf("modify qp %#x: %w", qp.Num(), err)
		}
	}
	if err := qp.ops.Modify(attr, mask); err != nil {
		if errors.Is(err, syscall.EINVAL) {
			if cur, qerr := qp.queryState(); qerr == nil && cur != qp.state {
				qp.state = cur
				if terr := check(cur); terr != nil {
					return fmt.Errorf("modify qp %#x: %w", qp.Num(), terr)
				}
			}
		}
		return fmt.Errorf("modify qp %#x: %w", qp.Num(), err)
	}
	if mask&QPAttrState != 0 {
		qp.state = attr.State
	}
	return nil
}

func (qp *QP) queryState() (QPState, error) {
	a, _, err := qp.ops.Query(QPAttrState)
	return a.State, err
}

// Query reports the attributes selected by mask and the QP's queue sizes.
func (qp *QP) Query(mask QPAttrMask) (QPAttr, QPCap, error) {
	a, c, err := qp.ops.Query(mask)
	if err != nil {
		return a, c, fmt.Errorf("query qp %#x: %w", qp.Num(), err)
	}
	return a, c, nil
}

// Close destroys the QP. Its outstanding work requests are discarded
// without completions. For an XRC receive QP it closes this opener; the QP
// itself is destroyed with its last opener.
func (qp *QP) Close() error {
	return qp.life.close(func() error {
		if err := qp.ops.Destroy(); err != nil {
			return fmt.Errorf("destroy qp: %w", err)
		}
		if qp.xrcd != nil {
			qp.xrcd.users.Add(-1)
		}
		qp.ctx.unregister(qp.handle)
		return nil
	})
}

// alive reports ErrClosed once srq is closed; a nil srq is alive.
func (srq *SRQ) alive() error {
	if srq == nil {
		return nil
	}
	return srq.life.alive()
}
