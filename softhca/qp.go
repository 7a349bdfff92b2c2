//go:build linux

package softhca

import (
	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/qpstate"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
	"github.com/xrcrun/xrc/softhca/roce"
)

// ring is a work queue in the client's QP buffer.
type ring struct {
	buf   []byte
	cnt   uint32 // slots, a power of two
	shift uint32 // log2 of the slot size
}

func (r *ring) slot(i uint32) []byte {
	off := int(i&(r.cnt-1)) << r.shift
	return r.buf[off : off+1<<r.shift]
}

// qp is a queue pair.
//
// Its fields are laid out by use, so that a message on a QP whose object
// has left the CPU's cache (with thousands of QPs, most have) misses as few
// cache lines as it can. Go starts an object of qp's size on a cache line,
// or 8 bytes after one (after an allocation header); the layout suits both.
// The first line holds what both sides read for every message; the next
// three the send CQ, the send queue and the requester's state, which a
// message reads and writes nearly all of; then two lines of the receive
// side: the receive CQ and SRQ, the XRC domain, the responder's state of a
// message and the scatter list of a receive (for SENDs); then the
// responder's XRC SRQ of a message and its READ and atomic resources. The
// attributes and bookkeeping only commands use come last, with the receive
// queue of a QP that has one (a QP on an SRQ, as in BenchmarkQPScaling, or
// an XRC one reads none of it). The engine prefetches these lines for a
// batch of messages (warm.go); TestQPLayout checks them.
type qp struct {
	num                          uint32
	destQPN                      uint32
	access                       uint32
	state                        qpstate.State
	typ                          qpstate.Type
	xport                        roce.Opcode // the transport prefix of its packets: RC, or XRC for both XRC types
	destroyed                    bool
	inErrq                       bool // in the engine's list of error-state QPs to flush
	pathMTU                      uint8
	timeout, retryCnt, rnrRetry  uint8
	minRNRTimer                  uint8
	maxRdAtomic, maxDestRdAtomic uint8
	dgid                         [16]byte // the address vector's destination GID (ah.DGID)
	pd                           *pd
	client                       *Client

	scq *cq
	sq  ring
	req requester
	// Bookkeeping of the commands, here so that the receive side starts
	// on a line of its own.
	userHandle uint64

	rcq *cq
	srq *srq
	// XRC: a receive QP's domain (nil for other QPs), which the responder
	// looks at for every request.
	xrcd *xrcd
	resp responder

	ah     uverbs.QPDest
	rq     ring
	rqGS   int
	rqDB   []byte // producer counter of the receive queue (16 bits)
	rqTook uint32 // receive WQEs consumed

	// XRC: a receive QP's openers (it has no client of its own).
	openers []*tgtOpen

	// Attributes and bookkeeping of the commands.
	sqdNotify          bool
	pkeyIndex          uint16
	port               uint8
	qkey, rqPSN, sqPSN uint32
	caps               uverbs.QPCap
}

// mtu is the QP's path MTU in bytes.
func (q *qp) mtu() uint32 { return 128 << q.pathMTU }

func (d *Device) cmdCreateQP(r *request) ([]byte, error) {
	req, drvb, err := payload[uverbs.CreateQP](r)
	if err != nil {
		return nil, err
	}
	drv, err := driverData[mlx4abi.IBCreateQP](r, drvb)
	if err != nil {
		return nil, err
	}
	c := r.c
	typ := qpstate.Type(req.QPType)
	switch typ {
	case qpstate.RC, qpstate.XRCIni:
	case qpstate.XRCTgt:
		// A receive QP of a domain: pd_handle names the domain, and the
		// QP has neither CQs nor queues (the kernel makes it with no
		// user memory, so the driver data is not looked at).
		return d.createTgtQP(r, &req)
	default:
		return nil, unix.Errorf(unix.EOPNOTSUPP, "qp type %v: the device runs RC and XRC QPs", typ)
	}
	ini := typ == qpstate.XRCIni
	p, err := object[*pd](c, req.PDHandle)
	if err != nil {
		return nil, err
	}
	scq, err := object[*cq](c, req.SendCQHandle)
	if err != nil {
		return nil, err
	}
	var rcq *cq
	var s *srq
	if ini {
		// An XRC send QP has no receive queue: the kernel ignores the
		// receive CQ and SRQ, and makes the receive capabilities 0.
		req.MaxRecvWR, req.MaxRecvSGE = 0, 0
	} else {
		if rcq, err = object[*cq](c, req.RecvCQHandle); err != nil {
			return nil, err
		}
		if req.IsSRQ != 0 {
			if s, err = object[*srq](c, req.SRQHandle); err != nil {
				return nil, err
			}
			if s.xrcd != nil {
				return nil, unix.Error(unix.EINVAL, "an XRC SRQ serves XRC receive QPs only")
			}
		}
	}
	if req.MaxSendWR > maxQPWR || req.MaxRecvWR > maxQPWR || req.MaxSendSGE > maxSGE ||
		req.MaxRecvSGE > maxSGE || req.MaxInlineData > maxInline {
		return nil, unix.Errorf(unix.EINVAL, "qp capabilities beyond the device's (%d WRs, %d SGEs, %d inline bytes)", maxQPWR, maxSGE, maxInline)
	}
	if d.qps.len() >= maxQP {
		return nil, unix.Error(unix.ENOMEM, "too many QPs")
	}
	q := &qp{typ: typ, state: qpstate.Reset, client: c, userHandle: req.UserHandle, pd: p,
		scq: scq, rcq: rcq, srq: s, port: 1,
		caps: uverbs.QPCap{MaxSendWR: req.MaxSendWR, MaxRecvWR: req.MaxRecvWR, MaxSendSGE: req.MaxSendSGE,
			MaxRecvSGE: req.MaxRecvSGE, MaxInlineData: req.MaxInlineData}}

	// The send queue's geometry comes from the driver data, the receive
	// queue's from the capabilities, as mlx4_ib lays out a user QP.
	if drv.LogSQStride < 6 || drv.LogSQStride > 11 || drv.LogSQBbCount > 16 || 1<<drv.LogSQBbCount > 2*maxQPWR {
		return nil, unix.Errorf(unix.EINVAL, "send queue of 2^%d WQEs of 2^%d bytes", drv.LogSQBbCount, drv.LogSQStride)
	}
	q.sq.cnt, q.sq.shift = 1<<drv.LogSQBbCount, uint32(drv.LogSQStride)
	if ini {
		q.xport = roce.TransportXRC
	} else if s == nil {
		q.rq.cnt = roundPow2(max(1, req.MaxRecvWR))
		q.rqGS = int(roundPow2(max(1, req.MaxRecvSGE)))
		q.rq.shift = uint32(log2(uint32(q.rqGS * mlx4hw.DataSegSize)))
	}
	rqBytes := int(q.rq.cnt) << q.rq.shift
	sqBytes := int(q.sq.cnt) << q.sq.shift
	buf, err := c.mem.queue(drv.BufAddr, rqBytes+sqBytes)
	if err != nil {
		return nil, err
	}
	// A buffer may start at any 64-byte boundary, not only a page's (a
	// provider packs small queues, mlx4.Packer). The device fetches a send
	// WQE only once its owner bit says it was posted, never ahead of that,
	// so it has no use for headroom slots, and sq_no_prefetch changes
	// nothing.
	if drv.BufAddr%64 != 0 {
		return nil, unix.Error(unix.EINVAL, "misaligned QP buffer")
	}
	if q.rq.shift > q.sq.shift {
		q.rq.buf, q.sq.buf = buf[:rqBytes], buf[rqBytes:]
	} else {
		q.sq.buf, q.rq.buf = buf[:sqBytes], buf[sqBytes:]
	}
	if s == nil && !ini {
		if q.rqDB, err = c.mem.queue(drv.DBAddr, mlx4hw.RQDBRecSize); err != nil {
			return nil, err
		}
		if drv.DBAddr%4 != 0 {
			return nil, unix.Error(unix.EINVAL, "misaligned doorbell record")
		}
	}
	resp := uverbs.CreateQPResp{MaxSendWR: req.MaxSendWR, MaxRecvWR: q.rq.cnt, MaxSendSGE: req.MaxSendSGE,
		MaxRecvSGE: uint32(q.rqGS), MaxInlineData: req.MaxInlineData}
	if r.outLen < int(unsafeSize(resp)) {
		return nil, unix.Error(unix.ENOSPC, "no room for the response")
	}
	q.req.heapIdx = -1
	q.num = d.allocQPN()
	d.qps.add(q)
	p.usecnt++
	scq.usecnt++
	if rcq != nil {
		rcq.usecnt++
	}
	if s != nil {
		s.usecnt++
	}
	resp.QPHandle = c.addObject(q)
	resp.QPN = q.num
	return response[uverbs.CreateQPResp, noDriver](r, &resp, nil)
}

// allocQPN gives out QP numbers in order, skipping those in use, so that a
// number is not reused soon after its QP is destroyed.
func (d *Device) allocQPN() uint32 {
	return allocNum(&d.nextQPN, firstQPN, 1<<23, func(n uint32) bool { return d.qps.getIndex(n) != nil })
}

// allocSRQN gives out an SRQ number: 24 bits, as the XRCETH and a CQE's
// g_mlpath_rqpn carry them, reusing freed ones (the SRQ limit keeps some
// free). Caller holds d.mu.
func (d *Device) allocSRQN() uint32 {
	return allocNum(&d.nextSRQ, 1, 1<<24, func(n uint32) bool { return d.srqs[n] != nil })
}

// allocNum gives out the number *next, or the first after it not used, in
// [first, limit), from first again after limit, and moves *next past it.
// Some number must be free (the device's object limits see to it).
func allocNum(next *uint32, first, limit uint32, used func(uint32) bool) uint32 {
	for {
		n := *next
		if *next++; *next >= limit {
			*next = first
		}
		if !used(n) {
			return n
		}
	}
}

func (d *Device) cmdDestroyQP(r *request) ([]byte, error) {
	req, _, err := payload[uverbs.DestroyQP](r)
	if err != nil {
		return nil, err
	}
	q, open, err := qpObject(r.c, req.QPHandle)
	if err != nil {
		return nil, err
	}
	if r.outLen < int(unsafeSize(uverbs.DestroyQPResp{})) { // fail before destroying anything
		return nil, unix.Error(unix.ENOSPC, "no room for the response")
	}
	if open != nil {
		d.closeTgt(open) // the QP goes with its last opener
	} else {
		d.destroyQP(q)
	}
	delete(r.c.objs, req.QPHandle)
	return response[uverbs.DestroyQPResp, noDriver](r, &uverbs.DestroyQPResp{}, nil)
}

// destroyQP forgets a QP. Its outstanding work requests are dropped without
// completions, as when the kernel destroys a QP.
func (d *Device) destroyQP(q *qp) {
	q.destroyed = true
	d.eng.watchErr(q)
	d.eng.cancelTimer(q)
	q.req.reset(&d.eng.wqes)
	q.resp.reset()
	d.qps.remove(q.num, d.nextQPN)
	if q.xrcd != nil {
		delete(q.xrcd.tgts, q.num)
		d.putXRCD(q.xrcd)
		return
	}
	q.pd.usecnt--
	q.scq.usecnt--
	if q.rcq != nil {
		q.rcq.usecnt--
	}
	if q.srq != nil {
		q.srq.usecnt--
	}
}

// Attribute mask bits, for brevity.
const (
	mState        = qpstate.AttrState
	mCurState     = qpstate.AttrCurState
	mSQDNotify    = qpstate.AttrEnSQDAsyncNotify
	mAccess       = qpstate.AttrAccessFlags
	mPkeyIndex    = qpstate.AttrPkeyIndex
	mPort         = qpstate.AttrPort
	mQkey         = qpstate.AttrQkey
	mAV           = qpstate.AttrAV
	mPathMTU      = qpstate.AttrPathMTU
	mTimeout      = qpstate.AttrTimeout
	mRetryCnt     = qpstate.AttrRetryCnt
	mRNRRetry     = qpstate.AttrRNRRetry
	mRQPSN        = qpstate.AttrRQPSN
	mMaxRdAtomic  = qpstate.AttrMaxQPRdAtomic
	mAltPath      = qpstate.AttrAltPath
	mMinRNRTimer  = qpstate.AttrMinRNRTimer
	mSQPSN        = qpstate.AttrSQPSN
	mMaxDestRdAtm = qpstate.AttrMaxDestRdAtomic
	mPathMig      = qpstate.AttrPathMigState
	mCap          = qpstate.AttrCap
	mDestQPN      = qpstate.AttrDestQPN
)

func (d *Device) cmdModifyQP(r *request) ([]byte, error) {
	req, _, err := payload[uverbs.ModifyQP](r)
	if err != nil {
		return nil, err
	}
	q, _, err := qpObject(r.c, req.QPHandle)
	if err != nil {
		return nil, err
	}
	mask := qpstate.Mask(req.AttrMask)
	cur := q.state
	if mask&mCurState != 0 {
		if qpstate.State(req.CurQPState) != q.state {
			return nil, unix.Errorf(unix.EINVAL, "current state %v given, the QP is %v", qpstate.State(req.CurQPState), q.state)
		}
	}
	next := cur
	if mask&mState != 0 {
		next = qpstate.State(req.QPState)
	}
	if err := qpstate.Check(q.typ, cur, next, mask); err != nil {
		return nil, unix.Error(unix.EINVAL, err.Error())
	}
	if err := d.checkQPAttrs(q, &req, mask); err != nil {
		return nil, err
	}
	d.applyQPAttrs(q, &req, mask)
	if mask&mState != 0 {
		d.setState(q, next)
	}
	return nil, nil
}

// checkQPAttrs validates attribute values as mlx4_ib and the core do.
func (d *Device) checkQPAttrs(q *qp, a *uverbs.ModifyQP, mask qpstate.Mask) error {
	if mask&mPort != 0 && a.PortNum != 1 {
		return unix.Errorf(unix.EINVAL, "port %d: the device has port 1", a.PortNum)
	}
	if mask&mPkeyIndex != 0 && a.PkeyIndex != 0 {
		return unix.Errorf(unix.EINVAL, "pkey index %d of 1", a.PkeyIndex)
	}
	if mask&mAccess != 0 && a.QPAccessFlags&^accKnown != 0 {
		return unix.Errorf(unix.EINVAL, "qp access flags %#x", a.QPAccessFlags)
	}
	if mask&mPathMTU != 0 && (a.PathMTU < 1 || a.PathMTU > mtuEnum(d.mtu)) {
		return unix.Errorf(unix.EINVAL, "path MTU %d above the port's %d", 128<<a.PathMTU, d.mtu)
	}
	if mask&mAV != 0 {
		if a.Dest.IsGlobal == 0 {
			return unix.Error(unix.EINVAL, "RoCE address vectors need a GRH (is_global)")
		}
		if a.Dest.SGIDIndex != 0 {
			return unix.Errorf(unix.EINVAL, "sgid index %d of 1", a.Dest.SGIDIndex)
		}
		if a.Dest.PortNum != 0 && a.Dest.PortNum != 1 {
			return unix.Errorf(unix.EINVAL, "address vector port %d", a.Dest.PortNum)
		}
	}
	if mask&mAltPath != 0 {
		return unix.Error(unix.EINVAL, "alternate paths are not supported on RoCE")
	}
	if mask&mMaxRdAtomic != 0 && a.MaxRdAtomic > maxQPInitRdAtm {
		return unix.Errorf(unix.EINVAL, "max_rd_atomic %d above %d", a.MaxRdAtomic, maxQPInitRdAtm)
	}
	if mask&mMaxDestRdAtm != 0 && a.MaxDestRdAtomic > maxQPRdAtom {
		return unix.Errorf(unix.EINVAL, "max_dest_rd_atomic %d above %d", a.MaxDestRdAtomic, maxQPRdAtom)
	}
	if mask&mRetryCnt != 0 && a.RetryCnt > 7 || mask&mRNRRetry != 0 && a.RNRRetry > 7 ||
		mask&mMinRNRTimer != 0 && a.MinRNRTimer > 31 || mask&mTimeout != 0 && a.Timeout > 31 {
		return unix.Error(unix.EINVAL, "retry count, RNR retry, RNR timer or timeout out of range")
	}
	if mask&mDestQPN != 0 && a.DestQPNum > 0xffffff {
		return unix.Errorf(unix.EINVAL, "destination QPN %#x", a.DestQPNum)
	}
	return nil
}

func (d *Device) applyQPAttrs(q *qp, a *uverbs.ModifyQP, mask qpstate.Mask) {
	if mask&mAccess != 0 {
		q.access = a.QPAccessFlags
	}
	if mask&mPkeyIndex != 0 {
		q.pkeyIndex = a.PkeyIndex
	}
	if mask&mPort != 0 {
		q.port = a.PortNum
	}
	if mask&mQkey != 0 {
		q.qkey = a.Qkey
	}
	if mask&mAV != 0 {
		q.ah = a.Dest
		q.dgid = a.Dest.DGID
	}
	if mask&mPathMTU != 0 {
		q.pathMTU = a.PathMTU
	}
	if mask&mTimeout != 0 {
		q.timeout = a.Timeout
	}
	if mask&mRetryCnt != 0 {
		q.retryCnt = a.RetryCnt
	}
	if mask&mRNRRetry != 0 {
		q.rnrRetry = a.RNRRetry
	}
	if mask&mRQPSN != 0 {
		q.rqPSN = a.RQPSN & 0xffffff
	}
	if mask&mMaxRdAtomic != 0 {
		q.maxRdAtomic = a.MaxRdAtomic
	}
	if mask&mMinRNRTimer != 0 {
		q.minRNRTimer = a.MinRNRTimer
	}
	if mask&mSQPSN != 0 {
		q.sqPSN = a.SQPSN & 0xffffff
	}
	if mask&mMaxDestRdAtm != 0 {
		q.maxDestRdAtomic = a.MaxDestRdAtomic
	}
	if mask&mDestQPN != 0 {
		q.destQPN = a.DestQPNum
	}
	if mask&mSQDNotify != 0 {
		q.sqdNotify = a.EnSQDAsyncNotify != 0
	}
}

// setState moves a QP to a new state and does what the move implies.
// Caller holds d.mu.
func (d *Device) setState(q *qp, next qpstate.State) {
	prev := q.state
	q.state = next
	d.eng.watchErr(q)
	switch next {
	case qpstate.Reset:
		d.eng.cancelTimer(q)
		q.req.reset(&d.eng.wqes)
		q.resp.reset()
		q.rqTook = 0
	case qpstate.RTR:
		if prev == qpstate.Init {
			q.resp.start(q)
		}
	case qpstate.RTS:
		if prev == qpstate.RTR {
			q.req.start(q)
		}
		q.req.drainSent = false
		d.eng.schedule(q) // requests posted before RTS run now
	case qpstate.SQD:
		// The requests posted (their doorbell rung) before the drain
		// began are the ones in progress: they complete, later ones wait.
		if prev == qpstate.RTS {
			q.state = qpstate.RTS
			if !d.fetchPosted(q) {
				return // a bad request put the QP in error
			}
			q.state = next
		}
		d.eng.schedule(q)
	case qpstate.Err:
		if prev != qpstate.Err {
			d.flush(q)
		}
	}
}

func (d *Device) cmdQueryQP(r *request) ([]byte, error) {
	req, _, err := payload[uverbs.QueryQP](r)
	if err != nil {
		return nil, err
	}
	q, _, err := qpObject(r.c, req.QPHandle)
	if err != nil {
		return nil, err
	}
	resp := uverbs.QueryQPResp{
		Dest: q.ah, MaxSendWR: q.caps.MaxSendWR, MaxRecvWR: q.caps.MaxRecvWR, MaxSendSGE: q.caps.MaxSendSGE,
		MaxRecvSGE: q.caps.MaxRecvSGE, MaxInlineData: q.caps.MaxInlineData, Qkey: q.qkey,
		RQPSN: q.rqPSN, SQPSN: q.sqPSN, DestQPNum: q.destQPN, QPAccessFlags: q.access,
		PkeyIndex: q.pkeyIndex, QPState: uint8(q.state), CurQPState: uint8(q.state), PathMTU: q.pathMTU,
		MaxRdAtomic: q.maxRdAtomic, MaxDestRdAtomic: q.maxDestRdAtomic, MinRNRTimer: q.minRNRTimer,
		PortNum: q.port, Timeout: q.timeout, RetryCnt: q.retryCnt, RNRRetry: q.rnrRetry,
	}
	if q.state == qpstate.SQD && len(q.req.q) > 0 {
		resp.SQDraining = 1
	}
	return response[uverbs.QueryQPResp, noDriver](r, &resp, nil)
}
