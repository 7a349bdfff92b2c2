//go:build linux

package mlx4

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
	"github.com/xrcrun/xrc/verbs"
)

// wq is one work queue of a QP: a ring of fixed-size WQE slots in the QP
// buffer, with the wr_id of each posted request.
type wq struct {
	head    uint32        // guarded by the queue's post lock: next slot to fill
	tail    atomic.Uint32 // advanced by polling: oldest outstanding slot
	cnt     uint32        // slots, a power of two
	maxPost uint32        // requests that may be outstanding
	shift   uint8         // log2 of the slot size
	closed  bool          // guarded by the post lock: the QP was destroyed, the ring freed
	maxGS   int32
	buf     []byte // the ring, a slice of the QP buffer
	// wrid holds the wr_id of the outstanding requests by slot index,
	// modulo its length: a power of two at least maxPost, so that the
	// requests outstanding never share an entry, and as short as that
	// allows, so that a queue's wr_ids take few cache lines however often
	// its ring wraps.
	wrid []uint64
}

func (q *wq) slot(i uint32) []byte {
	off := int(i&(q.cnt-1)) << q.shift
	return q.buf[off : off+1<<q.shift]
}

// setWRID records the wr_id of the request in slot i.
func (q *wq) setWRID(i uint32, id uint64) { q.wrid[i&uint32(len(q.wrid)-1)] = id }

// full reports whether n more requests would overflow the queue.
func (q *wq) full(n uint32) bool { return q.head+n-q.tail.Load() >= q.maxPost }

// retire completes the send WQE at index: WQEs before it (unsignaled ones)
// complete with it.
func (q *wq) retire(index uint16) uint64 {
	t := q.tail.Load()
	t += uint32(index - uint16(t))
	id := q.wrid[t&uint32(len(q.wrid)-1)]
	q.tail.Store(t + 1)
	return id
}

// retireNext completes the oldest receive WQE.
func (q *wq) retireNext() uint64 {
	t := q.tail.Load()
	id := q.wrid[t&uint32(len(q.wrid)-1)]
	q.tail.Store(t + 1)
	return id
}

// QP is a queue pair.
//
// What a post to the send queue and its completion read and write comes
// first, so that with thousands of QPs, whose objects are mostly out of
// the CPU's caches, a message misses few cache lines of its QP: the send
// queue's lock and ring, the context (for the doorbell) and the QP number
// fill the first 128 bytes. The object's size is a multiple of 64 bytes,
// which keeps the Go allocator from placing it across a cache line more
// than it needs.
type QP struct {
	sqMu   sync.Mutex
	sq     wq
	ctx    *Context
	qpn    uint32
	sigAll uint32 // CtrlCQUpdate when every request is signaled
	spare  uint32 // headroom slots kept free for prefetch; 0 if the device does not prefetch (Packer)
	typ    verbs.QPType
	// maxInline is read by inline posts.
	maxInline int
	// The verbs QP of this QP (verbs.QPHome), its ops (the first field) on
	// the line that posting reads.
	home verbs.QP
	srq  *SRQ

	handle uint32
	mem    ring // the QP buffer (both work queues) and the receive doorbell record, if any
	sendCQ *CQ
	recvCQ *CQ
	cap    verbs.QPCap

	rqMu sync.Mutex
	rq   wq
}

// sqWQEShift sizes send WQE slots as libmlx4 does: room for the control
// segment, the remote address segment and either the SGEs or the inline
// data, at least an atomic request, in whole basic blocks.
func sqWQEShift(c verbs.QPCap) uint8 {
	inlSegs := func(data int) int {
		data += (mlx4hw.CtrlSegSize + mlx4hw.RaddrSegSize) % mlx4hw.InlineAlign
		return (data + mlx4hw.InlineAlign - mlx4hw.InlineHdrSize - 1) / (mlx4hw.InlineAlign - mlx4hw.InlineHdrSize)
	}
	inl := int(c.MaxInlineData)
	maxGS := (inl + inlSegs(inl)*mlx4hw.InlineHdrSize + mlx4hw.DataSegSize - 1) / mlx4hw.DataSegSize
	maxGS = max(maxGS, int(c.MaxSendSGE))
	size := maxGS*mlx4hw.DataSegSize + mlx4hw.RaddrSegSize
	size = max(size, mlx4hw.AtomicSegSize+mlx4hw.RaddrSegSize+mlx4hw.DataSegSize)
	size += mlx4hw.CtrlSegSize
	shift := uint8(6)
	for 1<<shift < size {
		shift++
	}
	return shift
}

func roundPow2(n uint32) uint32 {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len32(n-1)
}

// CreateQP lays out the QP buffer, allocates it and the receive doorbell
// record, and issues CREATE_QP.
func (pd *PD) CreateQP(attr verbs.QPInit) (verbs.ProviderQP, error) {
	c := pd.ctx
	if attr.Type != verbs.QPTRC && attr.Type != verbs.QPTUC && attr.Type != verbs.QPTXRCIni {
		return nil, unix.Errorf(unix.EOPNOTSUPP, "qp type %v", attr.Type)
	}
	ini := attr.Type == verbs.QPTXRCIni
	if ini != (attr.RecvCQ == nil) || ini && attr.SRQ != nil {
		return nil, unix.Errorf(unix.EINVAL, "%v qp: a receive CQ or SRQ where it has no receive queue, or none where it has one", attr.Type)
	}
	dev, err := c.deviceAttr()
	if err != nil {
		return nil, err
	}
	cp := attr.Cap
	if cp.MaxSendWR > dev.MaxQPWR || cp.MaxRecvWR > dev.MaxQPWR || cp.MaxSendSGE > dev.MaxSGE || cp.MaxRecvSGE > dev.MaxSGE {
		return nil, unix.Errorf(unix.EINVAL, "qp capabilities %+v exceed the device's %d WRs and %d SGEs", cp, dev.MaxQPWR, dev.MaxSGE)
	}
	qp := &QP{ctx: c, typ: attr.Type, sendCQ: attr.SendCQ.(*CQ)}
	if attr.RecvCQ != nil {
		qp.recvCQ = attr.RecvCQ.(*CQ)
	}
	if attr.SRQ != nil {
		qp.srq = attr.SRQ.(*SRQ)
	}
	if attr.SigAll {
		qp.sigAll = mlx4hw.CtrlCQUpdate
	}

	qp.sq.shift = sqWQEShift(cp)
	// What a slot holds after the control and remote address segments, in
	// a WQE the control segment can describe.
	wqeSize := min(1<<qp.sq.shift, mlx4hw.MaxWQESize) - mlx4hw.CtrlSegSize - mlx4hw.RaddrSegSize
	qp.maxInline = wqeSize - mlx4hw.InlineHdrSize*((wqeSize+mlx4hw.InlineAlign-1)/mlx4hw.InlineAlign)
	if int(cp.MaxInlineData) > qp.maxInline {
		return nil, unix.Errorf(unix.EINVAL, "%d bytes of inline data: a send WQE carries at most %d", cp.MaxInlineData, qp.maxInline)
	}
	if !c.packed {
		// 2 KiB of slots that a prefetching device may read ahead of
		// the last WQE posted, plus one (rdma-core's sq_spare_wqes).
		qp.spare = (2048 >> qp.sq.shift) + 1
	}
	qp.sq.cnt = roundPow2(cp.MaxSendWR + qp.spare)
	if qp.srq == nil && !ini {
		cp.MaxRecvWR = max(cp.MaxRecvWR, 1)
		cp.MaxRecvSGE = max(cp.MaxRecvSGE, 1)
		qp.rq.cnt = roundPow2(cp.MaxRecvWR)
		qp.rq.maxGS = int32(roundPow2(cp.MaxRecvSGE))
		qp.rq.shift = uint8(bits.Len32(uint32(qp.rq.maxGS)*mlx4hw.DataSegSize) - 1)
	} else {
		cp.MaxRecvWR, cp.MaxRecvSGE = 0, 0
	}
	rqBytes := int(qp.rq.cnt) << qp.rq.shift
	sqBytes := int(qp.sq.cnt) << qp.sq.shift
	sqOff, rqOff := 0, sqBytes
	if qp.rq.shift > qp.sq.shift {
		rqOff, sqOff = 0, rqBytes
	}
	if qp.mem, err = c.allocRing(rqBytes+sqBytes, qp.rq.cnt > 0); err != nil {
		return nil, err
	}
	qp.sq.buf = qp.mem.buf[sqOff : sqOff+sqBytes]
	qp.rq.buf = qp.mem.buf[rqOff : rqOff+rqBytes]
	qp.initSQOwnership()

	logCnt := uint8(bits.Len32(qp.sq.cnt) - 1)
	req := mlx4abi.CreateQP{
		Core: uverbs.CreateQP{
			UserHandle: attr.Handle, PDHandle: pd.handle,
			SendCQHandle: qp.sendCQ.handle, RecvCQHandle: qp.sendCQ.handle,
			MaxSendWR: cp.MaxSendWR, MaxRecvWR: cp.MaxRecvWR, MaxSendSGE: cp.MaxSendSGE,
			MaxRecvSGE: cp.MaxRecvSGE, MaxInlineData: cp.MaxInlineData,
			QPType: uint8(attr.Type),
		},
		Drv: mlx4abi.IBCreateQP{
			BufAddr: addr(qp.mem.buf), DBAddr: addr(qp.mem.db), LogSQBbCount: logCnt, LogSQStride: uint8(qp.sq.shift),
		},
	}
	if c.packed {
		req.Drv.SQNoPrefetch = 1
	}
	if qp.recvCQ != nil {
		req.Core.RecvCQHandle = qp.recvCQ.handle
	}
	if attr.SigAll {
		req.Core.SQSigAll = 1
	}
	if qp.srq != nil {
		req.Core.SRQHandle = qp.srq.handle
		req.Core.IsSRQ = 1
	}
	var r uverbs.CreateQPResp
	if err := uverbs.Exec(c.conn, uverbs.CmdCreateQP, &req, &r); err != nil {
		c.freeRing(qp.mem)
		return nil, err
	}
	qp.handle, qp.qpn = r.QPHandle, r.QPN

	// The sizes the queues really have.
	qp.rq.maxPost = qp.rq.cnt
	qp.sq.maxGS = int32(wqeSize / mlx4hw.DataSegSize)
	qp.sq.maxPost = qp.sq.cnt - qp.spare
	qp.sq.wrid = make([]uint64, roundPow2(qp.sq.maxPost))
	qp.rq.wrid = make([]uint64, qp.rq.cnt)
	qp.cap = verbs.QPCap{
		MaxSendWR: qp.sq.maxPost, MaxRecvWR: qp.rq.maxPost, MaxSendSGE: uint32(qp.sq.maxGS),
		MaxRecvSGE: uint32(qp.rq.maxGS), MaxInlineData: uint32(qp.maxInline),
	}
	if err := c.storeQP(qp); err != nil {
		// Unusable: it could not be found by its completions.
		req := uverbs.Cmd[uverbs.DestroyQP]{Core: uverbs.DestroyQP{QPHandle: qp.handle}}
		var r uverbs.DestroyQPResp
		if derr := uverbs.Exec(c.conn, uverbs.CmdDestroyQP, &req, &r); derr != nil {
			return nil, errors.Join(err, derr) // the device may still use the ring: it stays
		}
		return nil, errors.Join(err, c.freeRing(qp.mem))
	}
	return qp, nil
}

// initSQOwnership marks every send slot as owned by the device for the
// first pass (so it is not executed) and stamps it against prefetch.
func (qp *QP) initSQOwnership() {
	for i := uint32(0); i < qp.sq.cnt; i++ {
		w := qp.sq.slot(i)
		w[7] = byte(1 << (qp.sq.shift - 4))
		mlx4hw.StoreBE32(w, mlx4hw.OwnerBit)
		qp.stamp(i)
	}
}

// stamp writes 0xffffffff at the start of every 64-byte block but the first
// of slot i, so that a prefetching device never takes stale data for a
// valid segment. Slots of one block have nothing to stamp: their WQE's
// size is not even read, which would touch a line of the send queue that
// the post has no other use for. Nor has a QP with no headroom, whose
// device does not prefetch (Packer).
func (qp *QP) stamp(i uint32) {
	if 1<<qp.sq.shift <= mlx4hw.BasicBlockSize || qp.spare == 0 {
		return
	}
	w := qp.sq.slot(i)
	ds := int(w[7]&0x3f) * 16
	for off := 64; off < ds; off += 64 {
		mlx4hw.StoreBE32(w[off:], 0xffffffff)
	}
}

// VerbsQP is the verbs QP that verbs.PD.CreateQP makes of qp
// (verbs.QPHome).
func (qp *QP) VerbsQP() *verbs.QP { return &qp.home }

// Num is the QP number.
func (qp *QP) Num() uint32 { return qp.qpn }

// Cap is the actual queue sizes.
func (qp *QP) Cap() verbs.QPCap { return qp.cap }

var sendOpcodes = [...]uint8{
	verbs.WRRDMAWrite:        mlx4hw.OpRDMAWrite,
	verbs.WRRDMAWriteWithImm: mlx4hw.OpRDMAWriteImm,
	verbs.WRSend:             mlx4hw.OpSend,
	verbs.WRSendWithImm:      mlx4hw.OpSendImm,
	verbs.WRRDMARead:         mlx4hw.OpRDMARead,
	verbs.WRAtomicCmpAndSwp:  mlx4hw.OpAtomicCS,
	verbs.WRAtomicFetchAdd:   mlx4hw.OpAtomicFA,
}

// PostSend builds one WQE per request and rings the send doorbell once.
func (qp *QP) PostSend(wr *verbs.SendWR) error {
	if qp.sq.cnt == 0 {
		return &verbs.PostError{Index: 0, Err: unix.Error(unix.EINVAL, "qp has no send queue")}
	}
	qp.sqMu.Lock()
	defer qp.sqMu.Unlock()
	if qp.sq.closed {
		return &verbs.PostError{Index: 0, Err: fmt.Errorf("mlx4: post send: %w", verbs.ErrClosed)}
	}
	var err error
	n := uint32(0)
	ind := qp.sq.head
	for ; wr != nil; wr, n = wr.Next, n+1 {
		if err = qp.checkSend(wr, n); err != nil {
			break
		}
		w := qp.sq.slot(ind)
		qp.sq.setWRID(ind, wr.WRID)
		op := sendOpcodes[wr.Opcode]
		off := mlx4hw.CtrlSegSize
		switch op {
		case mlx4hw.OpAtomicCS:
			mlx4hw.PutRaddrSeg(w[off:], wr.RemoteAddr, wr.RKey)
			mlx4hw.PutAtomicSeg(w[off+mlx4hw.RaddrSegSize:], wr.Swap, wr.CompareAdd)
			off += mlx4hw.RaddrSegSize + mlx4hw.AtomicSegSize
		case mlx4hw.OpAtomicFA:
			mlx4hw.PutRaddrSeg(w[off:], wr.RemoteAddr, wr.RKey)
			mlx4hw.PutAtomicSeg(w[off+mlx4hw.RaddrSegSize:], wr.CompareAdd, 0)
			off += mlx4hw.RaddrSegSize + mlx4hw.AtomicSegSize
		case mlx4hw.OpRDMAWrite, mlx4hw.OpRDMAWriteImm, mlx4hw.OpRDMARead:
			mlx4hw.PutRaddrSeg(w[off:], wr.RemoteAddr, wr.RKey)
			off += mlx4hw.RaddrSegSize
		}
		if wr.Flags&verbs.SendInline != 0 && len(wr.SG) > 0 {
			off = putInline(w, off, wr.SG)
		} else {
			for i := len(wr.SG) - 1; i >= 0; i-- {
				s := &wr.SG[i]
				mlx4hw.PutDataSeg(w[off+i*mlx4hw.DataSegSize:], s.Length, s.LKey, s.Addr)
			}
			off += len(wr.SG) * mlx4hw.DataSegSize
		}
		flags := qp.sigAll
		if qp.typ == verbs.QPTXRCIni {
			// The XRC SRQ the message goes to, in the upper 24 bits
			// of srcrb_flags.
			flags |= wr.RemoteSRQNum << 8
		}
		if wr.Flags&verbs.SendSignaled != 0 {
			flags |= mlx4hw.CtrlCQUpdate
		}
		if wr.Flags&verbs.SendSolicited != 0 {
			flags |= mlx4hw.CtrlSolicit
		}
		var imm uint32
		if op == mlx4hw.OpSendImm || op == mlx4hw.OpRDMAWriteImm {
			imm = wr.Imm
		}
		mlx4hw.PutCtrl(w, (off+15)/16, wr.Flags&verbs.SendFence != 0, flags, imm)
		owner := uint32(0)
		if ind&qp.sq.cnt != 0 {
			owner = mlx4hw.OwnerBit
		}
		// The owner word goes last: from here the device may run the WQE.
		mlx4hw.StoreBE32(w, uint32(op)|owner)
		if wr.Next != nil {
			qp.stamp((ind + qp.spare) & (qp.sq.cnt - 1))
		}
		ind++
	}
	if n > 0 {
		qp.sq.head = ind
		qp.ctx.uar.Write32(mlx4hw.UARSendDoorbell, qp.qpn<<8)
		qp.stamp((ind + qp.spare - 1) & (qp.sq.cnt - 1))
	}
	return err
}

// maxSendGS is how many SGEs a request of op fits in a slot: an atomic's
// segment takes the room of one.
func (qp *QP) maxSendGS(op verbs.WROpcode) int {
	if op == verbs.WRAtomicCmpAndSwp || op == verbs.WRAtomicFetchAdd {
		return int(qp.sq.maxGS) - mlx4hw.AtomicSegSize/mlx4hw.DataSegSize
	}
	return int(qp.sq.maxGS)
}

// checkSend validates request n of a post before any of it is written.
func (qp *QP) checkSend(wr *verbs.SendWR, n uint32) error {
	fail := func(errno unix.Errno, format string, args ...any) error {
		return &verbs.PostError{Index: int(n), Err: unix.Errorf(errno, format, args...)}
	}
	if qp.sq.full(n) {
		return fail(unix.ENOMEM, "send queue full (%d outstanding)", qp.sq.maxPost)
	}
	if int(wr.Opcode) >= len(sendOpcodes) {
		return fail(unix.EINVAL, "opcode %v", wr.Opcode)
	}
	if wr.Flags&verbs.SendInline != 0 {
		total := 0
		for _, s := range wr.SG {
			total += int(s.Length)
		}
		if total > qp.maxInline {
			return fail(unix.ENOMEM, "%d bytes of inline data, QP takes %d", total, qp.maxInline)
		}
		if wr.Opcode == verbs.WRRDMARead || wr.Opcode == verbs.WRAtomicCmpAndSwp || wr.Opcode == verbs.WRAtomicFetchAdd {
			return fail(unix.EINVAL, "inline %v", wr.Opcode)
		}
	} else if maxGS := qp.maxSendGS(wr.Opcode); len(wr.SG) > maxGS {
		return fail(unix.ENOMEM, "%d SGEs, QP takes %d for %v", len(wr.SG), maxGS, wr.Opcode)
	} else if err := checkSGLengths(wr.SG); err != nil {
		return &verbs.PostError{Index: int(n), Err: err}
	}
	return nil
}

// putInline copies the SG list's data into inline segments starting at off,
// never letting a segment cross a 64-byte boundary, and returns the end.
func putInline(w []byte, off int, sg []verbs.SGE) int {
	hdr := off // the current segment's header
	off += mlx4hw.InlineHdrSize
	seg := 0 // bytes in the current segment
	for _, s := range sg {
		src := unix.Bytes(uintptr(s.Addr), int(s.Length))
		for len(src) > 0 {
			room := mlx4hw.InlineAlign - off%mlx4hw.InlineAlign
			n := copy(w[off:off+min(room, len(src))], src)
			src, off, seg = src[n:], off+n, seg+n
			if off%mlx4hw.InlineAlign == 0 { // at a boundary: the next segment starts here
				mlx4hw.StoreBE32(w[hdr:], mlx4hw.InlineFlag|uint32(seg))
				hdr, off, seg = off, off+mlx4hw.InlineHdrSize, 0
			}
		}
	}
	if seg == 0 {
		return hdr // the last header opened holds no data
	}
	mlx4hw.StoreBE32(w[hdr:], mlx4hw.InlineFlag|uint32(seg))
	return off
}

// PostRecv writes receive WQEs and publishes the new head in the doorbell
// record.
func (qp *QP) PostRecv(wr *verbs.RecvWR) error {
	if qp.srq != nil || qp.rq.cnt == 0 {
		return &verbs.PostError{Index: 0, Err: unix.Error(unix.EINVAL, "qp has no receive queue")}
	}
	qp.rqMu.Lock()
	defer qp.rqMu.Unlock()
	if qp.rq.closed {
		return &verbs.PostError{Index: 0, Err: fmt.Errorf("mlx4: post receive: %w", verbs.ErrClosed)}
	}
	var err error
	n := uint32(0)
	for ; wr != nil; wr, n = wr.Next, n+1 {
		if qp.rq.full(n) {
			err = &verbs.PostError{Index: int(n), Err: unix.Error(unix.ENOMEM, "receive queue full")}
			break
		}
		if len(wr.SG) > int(qp.rq.maxGS) {
			err = &verbs.PostError{Index: int(n), Err: unix.Errorf(unix.EINVAL, "%d SGEs, QP takes %d", len(wr.SG), qp.rq.maxGS)}
			break
		}
		if e := checkSGLengths(wr.SG); e != nil {
			err = &verbs.PostError{Index: int(n), Err: e}
			break
		}
		i := qp.rq.head + n
		putRecvSG(qp.rq.slot(i), wr.SG, int(qp.rq.maxGS))
		qp.rq.setWRID(i, wr.WRID)
	}
	if n > 0 {
		qp.rq.head += n
		mlx4hw.StoreBE32(qp.mem.db, qp.rq.head&0xffff)
	}
	return err
}

func destFromAH(a *verbs.AHAttr) uverbs.QPDest {
	return uverbs.QPDest{
		DGID: a.GRH.DGID, FlowLabel: a.GRH.FlowLabel, DLID: a.DLID, SGIDIndex: a.GRH.SGIDIndex,
		HopLimit: a.GRH.HopLimit, TrafficClass: a.GRH.TrafficClass, SL: a.SL, SrcPathBits: a.SrcPathBits,
		StaticRate: a.StaticRate, IsGlobal: b2u(a.IsGlobal), PortNum: a.Port,
	}
}

func ahFromDest(d *uverbs.QPDest) verbs.AHAttr {
	return verbs.AHAttr{
		GRH: verbs.GlobalRoute{DGID: d.DGID, FlowLabel: d.FlowLabel, SGIDIndex: d.SGIDIndex,
			HopLimit: d.HopLimit, TrafficClass: d.TrafficClass},
		DLID: d.DLID, SL: d.SL, SrcPathBits: d.SrcPathBits, StaticRate: d.StaticRate,
		IsGlobal: d.IsGlobal != 0, Port: d.PortNum,
	}
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// Modify issues MODIFY_QP. Moving to RESET also resets the rings and
// removes the QP's unpolled CQEs, as libmlx4 does.
func (qp *QP) Modify(a *verbs.QPAttr, mask verbs.QPAttrMask) error {
	req := uverbs.Cmd[uverbs.ModifyQP]{Core: uverbs.ModifyQP{
		Dest: destFromAH(&a.AH), AltDest: destFromAH(&a.AltAH),
		QPHandle: qp.handle, AttrMask: uint32(mask), Qkey: a.Qkey, RQPSN: a.RQPSN, SQPSN: a.SQPSN,
		DestQPNum: a.DestQPN, QPAccessFlags: uint32(a.AccessFlags), PkeyIndex: a.PkeyIndex,
		AltPkeyIndex: a.AltPkeyIndex, QPState: uint8(a.State), CurQPState: uint8(a.CurState),
		PathMTU: uint8(a.PathMTU), PathMigState: a.PathMigState, EnSQDAsyncNotify: b2u(a.EnSQDAsyncNotify),
		MaxRdAtomic: a.MaxRdAtomic, MaxDestRdAtomic: a.MaxDestRdAtomic, MinRNRTimer: a.MinRNRTimer,
		PortNum: a.Port, Timeout: a.Timeout, RetryCnt: a.RetryCnt, RNRRetry: a.RNRRetry,
		AltPortNum: a.AltPort, AltTimeout: a.AltTimeout,
	}}
	if err := uverbs.ExecNoResp(qp.ctx.conn, uverbs.CmdModifyQP, &req); err != nil {
		return err
	}
	if mask&verbs.QPAttrState != 0 && a.State == verbs.QPSReset {
		qp.reset()
	}
	return nil
}

// cleanCQs removes the QP's unpolled CQEs from its CQs.
func (qp *QP) cleanCQs() {
	if qp.recvCQ != nil {
		qp.recvCQ.clean(qp.qpn, qp.srq)
	}
	if qp.sendCQ != nil && qp.sendCQ != qp.recvCQ {
		qp.sendCQ.clean(qp.qpn, nil)
	}
}

// reset empties both rings after the device has forgotten them.
func (qp *QP) reset() {
	qp.cleanCQs()
	if qp.sq.cnt == 0 {
		return // an XRC receive QP: no rings
	}
	qp.sqMu.Lock()
	qp.sq.head = 0
	qp.sq.tail.Store(0)
	qp.initSQOwnership()
	qp.sqMu.Unlock()
	qp.rqMu.Lock()
	qp.rq.head = 0
	qp.rq.tail.Store(0)
	if qp.mem.db != nil {
		mlx4hw.StoreBE32(qp.mem.db, 0)
	}
	qp.rqMu.Unlock()
}

// Query issues QUERY_QP.
func (qp *QP) Query(mask verbs.QPAttrMask) (verbs.QPAttr, verbs.QPCap, error) {
	req := uverbs.Cmd[uverbs.QueryQP]{Core: uverbs.QueryQP{QPHandle: qp.handle, AttrMask: uint32(mask)}}
	var r uverbs.QueryQPResp
	if err := uverbs.Exec(qp.ctx.conn, uverbs.CmdQueryQP, &req, &r); err != nil {
		return verbs.QPAttr{}, verbs.QPCap{}, err
	}
	a := verbs.QPAttr{
		State: verbs.QPState(r.QPState), CurState: verbs.QPState(r.CurQPState), PathMTU: verbs.MTU(r.PathMTU),
		PathMigState: r.PathMigState, Qkey: r.Qkey, RQPSN: r.RQPSN, SQPSN: r.SQPSN, DestQPN: r.DestQPNum,
		AccessFlags: verbs.Access(r.QPAccessFlags), AH: ahFromDest(&r.Dest), AltAH: ahFromDest(&r.AltDest),
		PkeyIndex: r.PkeyIndex, AltPkeyIndex: r.AltPkeyIndex, SQDraining: r.SQDraining != 0,
		MaxRdAtomic: r.MaxRdAtomic, MaxDestRdAtomic: r.MaxDestRdAtomic, MinRNRTimer: r.MinRNRTimer,
		Port: r.PortNum, Timeout: r.Timeout, RetryCnt: r.RetryCnt, RNRRetry: r.RNRRetry,
		AltPort: r.AltPortNum, AltTimeout: r.AltTimeout, Cap: qp.cap,
	}
	return a, qp.cap, nil
}

// Destroy issues DESTROY_QP and frees the rings.
func (qp *QP) Destroy() error {
	req := uverbs.Cmd[uverbs.DestroyQP]{Core: uverbs.DestroyQP{QPHandle: qp.handle}}
	var r uverbs.DestroyQPResp
	if err := destroyed(uverbs.Exec(qp.ctx.conn, uverbs.CmdDestroyQP, &req, &r)); err != nil {
		return err
	}
	if qp.mem.buf == nil {
		return nil // an XRC receive QP: no rings, not in the table
	}
	qp.cleanCQs()
	qp.ctx.forgetQP(qp)
	// Under the post locks, so that no post of another goroutine is in
	// the ring or the doorbell record.
	qp.sqMu.Lock()
	defer qp.sqMu.Unlock()
	qp.rqMu.Lock()
	defer qp.rqMu.Unlock()
	qp.sq.closed, qp.rq.closed = true, true
	return qp.ctx.freeRing(qp.mem)
}
