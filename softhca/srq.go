//go:build linux

package softhca

import (
	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
)

// srq is a shared receive queue. The client links its WQEs into a list by
// their next segments and counts posted WQEs in the doorbell record; the
// device takes WQEs in list order and counts what it took.
type srq struct {
	num        uint32
	client     *Client
	userHandle uint64
	pd         *pd
	buf        []byte
	max        uint32 // WQEs in the ring
	shift      uint
	maxGS      int
	db         []byte
	taken      uint16 // WQEs consumed, modulo 2^16 like the posted counter
	head       uint32 // the next WQE to take
	limit      uint32 // armed limit, 0 when not armed
	usecnt     int
	events     uint32
	// An XRC SRQ's domain, the handle it was made through, and the CQ its
	// completions go to; nil for other SRQs.
	xrcd *xrcd
	ux   *uxrcd
	cq   *cq
}

func (d *Device) cmdCreateSRQ(r *request) ([]byte, error) {
	req, drvb, err := payload[uverbs.CreateSRQ](r)
	if err != nil {
		return nil, err
	}
	return d.createSRQ(r, uverbs.CreateXSRQ{UserHandle: req.UserHandle, SRQType: uverbs.SRQTBasic,
		PDHandle: req.PDHandle, MaxWR: req.MaxWR, MaxSGE: req.MaxSGE, SRQLimit: req.SRQLimit}, drvb)
}

// cmdCreateXSRQ creates an SRQ of a given type: basic, as CREATE_SRQ does,
// or XRC, in a domain and with a CQ of its own.
func (d *Device) cmdCreateXSRQ(r *request) ([]byte, error) {
	req, drvb, err := payload[uverbs.CreateXSRQ](r)
	if err != nil {
		return nil, err
	}
	return d.createSRQ(r, req, drvb)
}

func (d *Device) createSRQ(r *request, req uverbs.CreateXSRQ, drvb []byte) ([]byte, error) {
	drv, err := driverData[mlx4abi.IBCreateSRQ](r, drvb)
	if err != nil {
		return nil, err
	}
	var ux *uxrcd
	var xcq *cq
	switch req.SRQType {
	case uverbs.SRQTBasic:
	case uverbs.SRQTXRC:
		if ux, err = object[*uxrcd](r.c, req.XRCDHandle); err != nil {
			return nil, err
		}
		if xcq, err = object[*cq](r.c, req.CQHandle); err != nil {
			return nil, err
		}
	default:
		return nil, unix.Errorf(unix.EINVAL, "srq type %d", req.SRQType)
	}
	p, err := object[*pd](r.c, req.PDHandle)
	if err != nil {
		return nil, err
	}
	if req.MaxWR < 1 || req.MaxWR > maxSRQWR || req.MaxSGE < 1 || req.MaxSGE > maxSRQSGE {
		return nil, unix.Errorf(unix.EINVAL, "srq of %d WRs and %d SGEs (at most %d and %d)", req.MaxWR, req.MaxSGE, maxSRQWR, maxSRQSGE)
	}
	if len(d.srqs) >= maxSRQ {
		return nil, unix.Error(unix.ENOMEM, "too many SRQs")
	}
	s := &srq{client: r.c, userHandle: req.UserHandle, pd: p, maxGS: int(req.MaxSGE)}
	s.max = roundPow2(req.MaxWR + 1)
	s.shift = log2(max(32, roundPow2(uint32(mlx4hw.SRQNextSegSize+s.maxGS*mlx4hw.DataSegSize))))
	if s.buf, err = r.c.mem.queue(drv.BufAddr, int(s.max)<<s.shift); err != nil {
		return nil, err
	}
	if s.db, err = r.c.mem.queue(drv.DBAddr, mlx4hw.RQDBRecSize); err != nil {
		return nil, err
	}
	if drv.DBAddr%4 != 0 {
		return nil, unix.Error(unix.EINVAL, "misaligned doorbell record")
	}
	core := uverbs.CreateSRQResp{MaxWR: s.max - 1, MaxSGE: req.MaxSGE}
	if r.outLen < int(unsafeSize(core)) {
		return nil, unix.Error(unix.ENOSPC, "no room for the response")
	}
	s.num = d.allocSRQN()
	d.srqs[s.num] = s
	p.usecnt++
	if ux != nil {
		s.xrcd, s.ux, s.cq = ux.x, ux, xcq
		ux.refcnt++
		ux.x.usecnt++
		xcq.usecnt++
	}
	core.SRQHandle = r.c.addObject(s)
	core.SRQN = s.num
	drvResp := mlx4abi.IBCreateSRQResp{SRQN: s.num}
	return response(r, &core, &drvResp)
}

func (d *Device) cmdModifySRQ(r *request) ([]byte, error) {
	req, _, err := payload[uverbs.ModifySRQ](r)
	if err != nil {
		return nil, err
	}
	s, err := object[*srq](r.c, req.SRQHandle)
	if err != nil {
		return nil, err
	}
	const maskMaxWR, maskLimit = 1, 2
	if req.AttrMask&^(maskMaxWR|maskLimit) != 0 {
		return nil, unix.Errorf(unix.EINVAL, "srq attribute mask %#x", req.AttrMask)
	}
	if req.AttrMask&maskMaxWR != 0 {
		return nil, unix.Error(unix.EINVAL, "resizing an SRQ is not supported")
	}
	if req.AttrMask&maskLimit != 0 {
		if req.SRQLimit >= s.max {
			return nil, unix.Errorf(unix.EINVAL, "srq limit %d of %d WQEs", req.SRQLimit, s.max)
		}
		s.limit = req.SRQLimit
		d.checkLimit(s)
	}
	return nil, nil
}

func (d *Device) cmdQuerySRQ(r *request) ([]byte, error) {
	req, _, err := payload[uverbs.QuerySRQ](r)
	if err != nil {
		return nil, err
	}
	s, err := object[*srq](r.c, req.SRQHandle)
	if err != nil {
		return nil, err
	}
	resp := uverbs.QuerySRQResp{MaxWR: s.max - 1, MaxSGE: uint32(s.maxGS), SRQLimit: s.limit}
	return response[uverbs.QuerySRQResp, noDriver](r, &resp, nil)
}

func (d *Device) cmdDestroySRQ(r *request) ([]byte, error) {
	req, _, err := payload[uverbs.DestroySRQ](r)
	if err != nil {
		return nil, err
	}
	s, err := object[*srq](r.c, req.SRQHandle)
	if err != nil {
		return nil, err
	}
	resp := uverbs.DestroySRQResp{EventsReported: s.events}
	if r.outLen < int(unsafeSize(resp)) { // fail before destroying anything
		return nil, unix.Error(unix.ENOSPC, "no room for the response")
	}
	if err := d.destroySRQ(s); err != nil {
		return nil, err
	}
	delete(r.c.objs, req.SRQHandle)
	return response[uverbs.DestroySRQResp, noDriver](r, &resp, nil)
}

func (d *Device) destroySRQ(s *srq) error {
	if s.usecnt > 0 {
		return unix.Errorf(unix.EBUSY, "srq %d is used by %d QPs", s.num, s.usecnt)
	}
	delete(d.srqs, s.num)
	s.pd.usecnt--
	if s.ux != nil {
		// Receive QPs of the domain in the middle of a message for it
		// forget the message: its next packet is out of sequence.
		for _, q := range s.xrcd.tgts {
			if r := &q.resp; r.xsrq == s {
				r.xsrq, r.hasRecv, r.inMsg, r.wm = nil, false, false, nil
			}
		}
		s.ux.refcnt--
		s.cq.usecnt--
		d.putXRCD(s.xrcd)
	}
	return nil
}

// posted is the number of WQEs posted and not yet taken.
func (s *srq) posted() uint32 {
	return uint32(uint16(mlx4hw.LoadBE32(s.db)) - s.taken)
}

// take consumes the next posted WQE, appending its scatter list to sg. It
// reports false when none is posted. Caller holds d.mu.
func (d *Device) srqTake(s *srq, sg []mlx4hw.DataSeg) (uint32, []mlx4hw.DataSeg, bool) {
	if s.posted() == 0 {
		return 0, sg, false
	}
	idx := s.head & (s.max - 1)
	w := s.buf[int(idx)<<s.shift : int(idx+1)<<s.shift]
	sg = mlx4hw.DecodeRecvSG(w[mlx4hw.SRQNextSegSize:], s.maxGS, sg)
	s.head = uint32(mlx4hw.SRQNext(w))
	s.taken++
	d.checkLimit(s)
	return idx, sg, true
}

// checkLimit raises the limit event when an armed SRQ holds fewer WQEs
// than its limit, and disarms it.
func (d *Device) checkLimit(s *srq) {
	if s.limit != 0 && s.posted() < s.limit {
		s.limit = 0
		s.events++
		s.client.asyncEvent(s.userHandle, evSRQLimitReached)
	}
}
