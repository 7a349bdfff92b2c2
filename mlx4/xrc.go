//go:build linux

package mlx4

import (
	"errors"

	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
	"github.com/xrcrun/xrc/verbs"
)

// XRC, as libmlx4 drives it: OPEN_XRCD and CLOSE_XRCD carry no driver
// data; an XRC SRQ is CREATE_XSRQ with mlx4's SRQ driver data and is found
// again by its number when its completions are polled; an XRC receive QP is
// CREATE_QP with the domain's handle in pd_handle and no queues of its own
// (the kernel creates it without user memory); OPEN_QP shares one.

var _ verbs.XRCProvider = (*Context)(nil)

// XRCD is an open XRC domain.
type XRCD struct {
	ctx    *Context
	handle uint32
}

// OpenXRCD issues OPEN_XRCD for the file fd (or -1).
func (c *Context) OpenXRCD(fd int, oflags int) (verbs.ProviderXRCD, error) {
	req := uverbs.Cmd[uverbs.OpenXRCD]{Core: uverbs.OpenXRCD{FD: uint32(int32(fd)), Oflags: uint32(oflags)}}
	var r uverbs.OpenXRCDResp
	if err := uverbs.Exec(c.conn, uverbs.CmdOpenXRCD, &req, &r); err != nil {
		return nil, err
	}
	return &XRCD{ctx: c, handle: r.XRCDHandle}, nil
}

// Close issues CLOSE_XRCD.
func (x *XRCD) Close() error {
	req := uverbs.Cmd[uverbs.CloseXRCD]{Core: uverbs.CloseXRCD{XRCDHandle: x.handle}}
	return destroyed(uverbs.ExecNoResp(x.ctx.conn, uverbs.CmdCloseXRCD, &req))
}

// CreateXRCSRQ allocates an SRQ ring as for any SRQ and issues CREATE_XSRQ.
// The SRQ's number, which CQEs of XRC receives carry, goes into the table
// Poll looks it up in.
func (c *Context) CreateXRCSRQ(pd verbs.ProviderPD, xrcd verbs.ProviderXRCD, cq verbs.ProviderCQ, attr verbs.SRQInit) (verbs.ProviderSRQ, error) {
	mpd, x, mcq := pd.(*PD), xrcd.(*XRCD), cq.(*CQ)
	s, err := c.newSRQ(attr.Attr)
	if err != nil {
		return nil, err
	}
	s.cq = mcq
	req := mlx4abi.CreateXSRQ{
		Core: uverbs.CreateXSRQ{UserHandle: attr.Handle, SRQType: uverbs.SRQTXRC, PDHandle: mpd.handle,
			MaxWR: attr.Attr.MaxWR, MaxSGE: attr.Attr.MaxSGE, SRQLimit: attr.Attr.SRQLimit,
			XRCDHandle: x.handle, CQHandle: mcq.handle},
		Drv: mlx4abi.IBCreateSRQ{BufAddr: addr(s.buf), DBAddr: addr(s.db)},
	}
	var r mlx4abi.CreateSRQResp
	if err := uverbs.Exec(c.conn, uverbs.CmdCreateXSRQ, &req, &r); err != nil {
		c.freeRing(s.ring)
		return nil, err
	}
	s.handle, s.srqn = r.Core.SRQHandle, r.Core.SRQN
	if err := c.xsrqs.add(s.srqn, s); err != nil {
		// Unusable: it could not be found by its completions.
		req := uverbs.Cmd[uverbs.DestroySRQ]{Core: uverbs.DestroySRQ{SRQHandle: s.handle}}
		var r uverbs.DestroySRQResp
		if derr := uverbs.Exec(c.conn, uverbs.CmdDestroySRQ, &req, &r); derr != nil {
			return nil, errors.Join(err, derr) // the device may still use the ring: it stays
		}
		return nil, errors.Join(err, c.freeRing(s.ring))
	}
	return s, nil
}

// CreateXRCTgtQP issues CREATE_QP for an XRC receive QP: the domain's
// handle in pd_handle, no CQs, no queue memory.
func (c *Context) CreateXRCTgtQP(xrcd verbs.ProviderXRCD, handle uint64) (verbs.ProviderQP, error) {
	x := xrcd.(*XRCD)
	req := mlx4abi.CreateQP{Core: uverbs.CreateQP{UserHandle: handle, PDHandle: x.handle, QPType: uverbs.QPTXRCTgt}}
	var r uverbs.CreateQPResp
	if err := uverbs.Exec(c.conn, uverbs.CmdCreateQP, &req, &r); err != nil {
		return nil, err
	}
	return &QP{ctx: c, typ: verbs.QPTXRCTgt, handle: r.QPHandle, qpn: r.QPN}, nil
}

// OpenXRCQP issues OPEN_QP for the domain's receive QP numbered num.
func (c *Context) OpenXRCQP(xrcd verbs.ProviderXRCD, num uint32, handle uint64) (verbs.ProviderQP, error) {
	x := xrcd.(*XRCD)
	if num > 0xffffff {
		return nil, unix.Errorf(unix.EINVAL, "qp number %#x", num)
	}
	req := uverbs.Cmd[uverbs.OpenQP]{Core: uverbs.OpenQP{UserHandle: handle, PDHandle: x.handle, QPN: num, QPType: uverbs.QPTXRCTgt}}
	var r uverbs.CreateQPResp
	if err := uverbs.Exec(c.conn, uverbs.CmdOpenQP, &req, &r); err != nil {
		return nil, err
	}
	return &QP{ctx: c, typ: verbs.QPTXRCTgt, handle: r.QPHandle, qpn: r.QPN}, nil
}
