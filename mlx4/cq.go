//go:build linux

package mlx4

import (
	"fmt"
	"math/bits"
	"sync"

	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
	"github.com/xrcrun/xrc/verbs"
)

// CQ is a completion queue: a ring of CQEs the device writes and Poll
// consumes.
type CQ struct {
	ctx    *Context
	handle uint32
	cqn    uint32
	ring          // the CQE ring, shared with the device, and its doorbell record: set_ci word, then arm word
	n      uint32 // entries, a power of two

	mu     sync.Mutex // serializes Poll, Arm and cleaning
	ci     uint32     // guarded by mu: consumer index
	armSN  uint32     // guarded by mu: arm sequence number
	lastQP *QP        // guarded by mu: the QP of the last CQE, a lookup cache
	dead   bool       // guarded by mu: destroyed, the ring freed
}

// CreateCQ allocates the CQE ring and a doorbell record and issues
// CREATE_CQ.
func (c *Context) CreateCQ(attr verbs.CQInit) (verbs.ProviderCQ, error) {
	if attr.CQE < 1 || attr.CQE > 0x3fffff {
		return nil, unix.Errorf(unix.EINVAL, "cq of %d entries", attr.CQE)
	}
	n := uint32(1) << bits.Len32(uint32(attr.CQE)) // roundup_pow_of_two(cqe+1)
	cq := &CQ{ctx: c, n: n, armSN: 1}
	var err error
	if cq.ring, err = c.allocRing(int(n)*c.cqe, true); err != nil {
		return nil, err
	}
	// A fresh ring: every entry owned by the device for the first pass.
	for i := uint32(0); i < n; i++ {
		cq.entry(i)[mlx4hw.CQESize-1] = mlx4hw.CQEOwnerMask
	}
	ch := int32(-1)
	if attr.Channel != nil {
		ch = attr.Channel.(*channel).fd
	}
	req := mlx4abi.CreateCQ{
		Core: uverbs.CreateCQ{UserHandle: attr.Handle, CQE: n - 1, CompVector: uint32(attr.CompVector), CompChannel: ch},
		Drv:  mlx4abi.IBCreateCQ{BufAddr: addr(cq.buf), DBAddr: addr(cq.db)},
	}
	var r mlx4abi.CreateCQResp
	if err := uverbs.Exec(c.conn, uverbs.CmdCreateCQ, &req, &r); err != nil {
		c.freeRing(cq.ring)
		return nil, err
	}
	cq.handle, cq.cqn = r.Core.CQHandle, r.Drv.CQN
	return cq, nil
}

// entry returns the CQE slot for index i (the 32-byte CQE is the last half of
// a 64-byte entry).
func (cq *CQ) entry(i uint32) []byte {
	sz := cq.ctx.cqe
	off := int(i&(cq.n-1)) * sz
	return cq.buf[off+sz-mlx4hw.CQESize : off+sz]
}

// ready reports whether the entry at index i holds a new CQE: its owner bit
// matches the pass the index is in.
func (cq *CQ) ready(i uint32) bool {
	return mlx4hw.CQEOwner(cq.entry(i)) == (i&cq.n != 0)
}

// CQE is the number of usable entries.
func (cq *CQ) CQE() int { return int(cq.n - 1) }

// Poll consumes up to len(wc) CQEs.
func (cq *CQ) Poll(wc []verbs.WorkCompletion) (int, error) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead {
		return 0, fmt.Errorf("mlx4: poll: %w", verbs.ErrClosed)
	}
	var err error
	n := 0
	for n < len(wc) && cq.ready(cq.ci) {
		e, derr := mlx4hw.DecodeCQE(cq.entry(cq.ci))
		cq.ci++
		if derr == nil {
			derr = cq.complete(&e, &wc[n])
		}
		if derr != nil {
			err = derr
			break
		}
		n++
	}
	if n > 0 || err != nil {
		mlx4hw.StoreBE32(cq.db[0:], cq.ci&0xffffff)
	}
	if n == 0 && err == nil && cq.ctx.yield != nil {
		cq.ctx.yield()
	}
	return n, err
}

// complete turns a CQE into a work completion, retiring the WQE it names.
// A receive of an XRC receive QP names its XRC SRQ by number in the
// g_mlpath_rqpn word, as the hardware writes it: the SRQ is found by that
// number, the QP (which this process may not even have opened) is not
// needed.
func (cq *CQ) complete(e *mlx4hw.CQE, wc *verbs.WorkCompletion) error {
	qpn := e.MyQPN
	if qpn&mlx4hw.XRCQPNBit != 0 && !e.IsSend {
		srqn := e.GMLPath & mlx4hw.CQEQPNMask
		srq := cq.ctx.xsrqs.find(srqn)
		if srq == nil {
			return unix.Errorf(unix.EIO, "cqe of xrc qp %#x for unknown xrc srq %#x", qpn, srqn)
		}
		id := srq.retire(e.WQEIndex)
		fillWC(e, wc)
		wc.WRID = id
		return nil
	}
	if !e.IsSend {
		if srq := cq.ctx.qpSRQs.find(qpn); srq != nil {
			id := srq.retire(e.WQEIndex)
			fillWC(e, wc)
			wc.WRID = id
			return nil
		}
	}
	qp := cq.lastQP
	if qp == nil || qp.qpn != qpn {
		qp = cq.ctx.findQP(qpn)
		if qp == nil {
			return unix.Errorf(unix.EIO, "cqe for unknown qp %#x", qpn)
		}
		cq.lastQP = qp
	}
	var id uint64
	switch {
	case e.IsSend:
		id = qp.sq.retire(e.WQEIndex)
	case qp.srq != nil: // not reached: qpSRQs holds the QPs on an SRQ
		id = qp.srq.retire(e.WQEIndex)
	default:
		id = qp.rq.retireNext()
	}
	fillWC(e, wc)
	wc.WRID = id
	return nil
}

// fillWC turns a CQE into a work completion, all but its wr_id.
func fillWC(e *mlx4hw.CQE, wc *verbs.WorkCompletion) {
	*wc = verbs.WorkCompletion{QPNum: e.MyQPN}
	if e.IsError() {
		wc.Status = syndromeStatus(e.Syndrome)
		wc.VendorErr = uint32(e.VendorErr)
		return
	}
	if e.IsSend {
		switch e.Opcode {
		case mlx4hw.OpRDMAWriteImm:
			wc.Flags = verbs.WCWithImm
			wc.Opcode = verbs.WCRDMAWrite
		case mlx4hw.OpRDMAWrite:
			wc.Opcode = verbs.WCRDMAWrite
		case mlx4hw.OpSendImm:
			wc.Flags = verbs.WCWithImm
			wc.Opcode = verbs.WCSend
		case mlx4hw.OpRDMARead:
			wc.Opcode = verbs.WCRDMARead
			wc.ByteLen = e.ByteCnt
		case mlx4hw.OpAtomicCS:
			wc.Opcode = verbs.WCCompSwap
			wc.ByteLen = 8
		case mlx4hw.OpAtomicFA:
			wc.Opcode = verbs.WCFetchAdd
			wc.ByteLen = 8
		default:
			wc.Opcode = verbs.WCSend
		}
		return
	}
	wc.ByteLen = e.ByteCnt
	switch e.Opcode {
	case mlx4hw.RecvOpRDMAWriteImm:
		wc.Opcode = verbs.WCRecvRDMAWithImm
		wc.Flags = verbs.WCWithImm
		wc.Imm = e.Immed
	case mlx4hw.RecvOpSendImm:
		wc.Opcode = verbs.WCRecv
		wc.Flags = verbs.WCWithImm
		wc.Imm = e.Immed
	case mlx4hw.RecvOpSendInval:
		wc.Opcode = verbs.WCRecv
		wc.Flags = verbs.WCWithInv
	default:
		wc.Opcode = verbs.WCRecv
	}
	wc.SLID = e.RLID
	wc.SrcQP = e.GMLPath & 0xffffff
	wc.DLIDPathBits = uint8(e.GMLPath>>24) & 0x7f
	if e.GMLPath&(1<<31) != 0 {
		wc.Flags |= verbs.WCWithGRH
	}
	wc.SL = uint8(e.SLVID >> 13) // RoCE: the priority bits of the VLAN tag
}

// syndromeStatus maps an error CQE's syndrome to a completion status.
func syndromeStatus(s uint8) verbs.WCStatus {
	switch s {
	case mlx4hw.SyndromeLocalLengthErr:
		return verbs.WCLocLenErr
	case mlx4hw.SyndromeLocalQPOpErr:
		return verbs.WCLocQPOpErr
	case mlx4hw.SyndromeLocalProtErr:
		return verbs.WCLocProtErr
	case mlx4hw.SyndromeWRFlushErr:
		return verbs.WCWRFlushErr
	case mlx4hw.SyndromeMWBindErr:
		return verbs.WCMWBindErr
	case mlx4hw.SyndromeBadRespErr:
		return verbs.WCBadRespErr
	case mlx4hw.SyndromeLocalAccessErr:
		return verbs.WCLocAccessErr
	case mlx4hw.SyndromeRemoteInvalReqErr:
		return verbs.WCRemInvReqErr
	case mlx4hw.SyndromeRemoteAccessErr:
		return verbs.WCRemAccessErr
	case mlx4hw.SyndromeRemoteOpErr:
		return verbs.WCRemOpErr
	case mlx4hw.SyndromeRetryExcErr:
		return verbs.WCRetryExcErr
	case mlx4hw.SyndromeRNRRetryExcErr:
		return verbs.WCRNRRetryExcErr
	case mlx4hw.SyndromeRemoteAbortedErr:
		return verbs.WCRemAbortErr
	}
	return verbs.WCGeneralErr
}

// Arm writes the arm word of the doorbell record and rings the CQ doorbell.
func (cq *CQ) Arm(solicitedOnly bool) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead {
		return fmt.Errorf("mlx4: arm: %w", verbs.ErrClosed)
	}
	sn := cq.armSN & 3
	ci := cq.ci & 0xffffff
	cmd := uint32(mlx4hw.CQDBReqNot)
	if solicitedOnly {
		cmd = mlx4hw.CQDBReqNotSol
	}
	mlx4hw.StoreBE32(cq.db[4:], sn<<28|cmd|ci)
	cq.ctx.uar.Write64(mlx4hw.UARCQDoorbell, uint64(sn<<28|cmd|cq.cqn)<<32|uint64(ci))
	return nil
}

// EventDelivered advances the arm sequence number after an event.
func (cq *CQ) EventDelivered() {
	cq.mu.Lock()
	cq.armSN++
	cq.mu.Unlock()
}

// clean removes the CQEs of QP qpn that have not been polled, as a QP
// leaving for RESET or being destroyed requires. The entries that remain
// move toward the producer end, keeping their order, and the consumer index
// advances past the freed slots. freeSRQ, when not nil, takes back the SRQ
// WQEs the removed receive CQEs consumed.
func (cq *CQ) clean(qpn uint32, srq *SRQ) {
	cq.cleanWhere(func(c *mlx4hw.CQE) bool { return c.MyQPN == qpn }, srq)
	cq.mu.Lock()
	if cq.lastQP != nil && cq.lastQP.qpn == qpn {
		cq.lastQP = nil
	}
	cq.mu.Unlock()
}

// cleanXSRQ removes the unpolled receive completions of the XRC SRQ s,
// whichever QP they came through, and takes back their WQEs.
func (cq *CQ) cleanXSRQ(s *SRQ) {
	cq.cleanWhere(func(c *mlx4hw.CQE) bool {
		return c.MyQPN&mlx4hw.XRCQPNBit != 0 && !c.IsSend && c.GMLPath&mlx4hw.CQEQPNMask == s.srqn
	}, s)
}

// cleanWhere removes the unpolled CQEs that match, as clean does.
func (cq *CQ) cleanWhere(match func(*mlx4hw.CQE) bool, srq *SRQ) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.dead {
		return
	}
	prod := cq.ci
	for prod-cq.ci < cq.n && cq.ready(prod) {
		prod++
	}
	freed := uint32(0)
	for i := prod; i != cq.ci; {
		i--
		e := cq.entry(i)
		c, _ := mlx4hw.DecodeCQE(e)
		if match(&c) {
			if srq != nil && !c.IsSend {
				srq.retire(c.WQEIndex)
			}
			freed++
			continue
		}
		if freed > 0 {
			d := cq.entry(i + freed)
			owner := mlx4hw.CQEOwner(d)
			c.Owner = owner
			c.Put(d)
		}
	}
	if freed > 0 {
		cq.ci += freed
		mlx4hw.StoreBE32(cq.db[0:], cq.ci&0xffffff)
	}
}

// Destroy issues DESTROY_CQ and frees the ring.
func (cq *CQ) Destroy() error {
	req := uverbs.Cmd[uverbs.DestroyCQ]{Core: uverbs.DestroyCQ{CQHandle: cq.handle}}
	var r uverbs.DestroyCQResp
	if err := destroyed(uverbs.Exec(cq.ctx.conn, uverbs.CmdDestroyCQ, &req, &r)); err != nil {
		return err
	}
	// Under the lock, so that no Poll or Arm of another goroutine is in
	// the ring or the doorbell record, which may be another queue's next.
	cq.mu.Lock()
	defer cq.mu.Unlock()
	cq.dead = true
	return cq.ctx.freeRing(cq.ring)
}
