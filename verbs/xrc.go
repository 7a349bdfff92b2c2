package verbs

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
)

// This file is XRC (eXtended Reliable Connection): XRC domains, XRC SRQs,
// XRC send (INI) QPs and XRC receive (TGT) QPs, as uverbs ABI 6 and
// libibverbs define them.
//
// An XRC domain groups the XRC SRQs and receive QPs that may serve each
// other. Processes share a domain by opening it from the same file: the
// device keys domains by the file's inode. A sender's INI QP connects to a
// receive (TGT) QP of the remote node and names, in each send work request
// (SendWR.RemoteSRQNum), the XRC SRQ of the domain that receives the
// message; receive completions land on that SRQ's CQ and carry the TGT QP's
// number. TGT QPs belong to the domain, not to the process that created
// them: any process of the domain opens one by number (XRCD.OpenQP), and it
// lives until the last of its openers has closed it.

// XRCProvider is the optional XRC capability of a Provider. A provider
// without XRC does not implement it and keeps working; Context.Supports
// (FeatureXRC) then reports ErrNotSupported, as do the XRC methods of this
// package. A provider that implements it also accepts QPTXRCIni in
// ProviderPD.CreateQP (with a send CQ, no receive CQ and no SRQ).
type XRCProvider interface {
	// OpenXRCD opens the XRC domain of the file fd refers to, or with fd
	// -1 a new domain of its own. oflags holds O_CREAT (create the
	// domain if the file has none) and O_EXCL (fail if it has one), as
	// OPEN_XRCD takes them. fd is only used during the call.
	OpenXRCD(fd int, oflags int) (ProviderXRCD, error)
	// CreateXRCSRQ creates an XRC SRQ of the domain: its receive buffers
	// belong to pd, its completions go to cq.
	CreateXRCSRQ(pd ProviderPD, xrcd ProviderXRCD, cq ProviderCQ, attr SRQInit) (ProviderSRQ, error)
	// CreateXRCTgtQP creates an XRC receive QP in the domain and opens it;
	// handle names it in async events.
	CreateXRCTgtQP(xrcd ProviderXRCD, handle uint64) (ProviderQP, error)
	// OpenXRCQP opens the domain's receive QP numbered num. Destroying
	// the returned QP closes this opener; the QP lives while others are
	// open.
	OpenXRCQP(xrcd ProviderXRCD, num uint32, handle uint64) (ProviderQP, error)
}

// ProviderXRCD is an open XRC domain.
type ProviderXRCD interface {
	// Close drops this reference to the domain; the last one destroys it.
	// It fails with EBUSY while SRQs or QPs made through this reference
	// live.
	Close() error
}

// FeatureXRC is the XRC transport: XRC domains, SRQs and QPs.
const FeatureXRC Feature = FeatureSRQResize + 1

// xrc returns the XRC capability of the device, or an error matching
// ErrNotSupported.
func (c *Context) xrc() (XRCProvider, error) {
	if err := c.Supports(FeatureXRC); err != nil {
		return nil, err
	}
	return c.prov.(XRCProvider), nil
}

// notSupported turns the kernel's EOPNOTSUPP for an XRC command into the
// feature's verdict, which is cached.
func (c *Context) notSupported(err error) error {
	if !errors.Is(err, syscall.EOPNOTSUPP) {
		return err
	}
	e := &UnsupportedFeatureError{Feature: FeatureXRC, Device: c.name, Reason: "the kernel refused XRC", Err: err}
	c.features.Store(FeatureXRC, error(e))
	return e
}

// XRCD is an XRC domain opened by this context. It is safe for concurrent
// use.
type XRCD struct {
	ctx    *Context
	ops    ProviderXRCD
	handle uint64
	users  atomic.Int32 // SRQs and QPs made or opened through this XRCD
	life   lifecycle
}

// OpenXRCD opens the XRC domain of the file f, or with f nil a new domain
// private to this XRCD. Processes that open the same file (the same inode)
// share its domain. oflags may hold os.O_CREATE, to create the domain when
// the file has none (else opening fails with EAGAIN), and os.O_EXCL, to
// fail with EINVAL when it has one. f is used only during the call; the
// domain lives until its last opener closes it.
func (c *Context) OpenXRCD(f *os.File, oflags int) (*XRCD, error) {
	if oflags&^(os.O_CREATE|os.O_EXCL) != 0 {
		return nil, fmt.Errorf("open xrcd: flags %#x: only O_CREATE and O_EXCL: %w", oflags, syscall.EINVAL)
	}
	p, err := c.xrc()
	if err != nil {
		return nil, fmt.Errorf("open xrcd: %w", err)
	}
	fd := -1
	if f != nil {
		fd = int(f.Fd())
	}
	h, err := c.register()
	if err != nil {
		return nil, fmt.Errorf("open xrcd: %w", err)
	}
	ops, err := p.OpenXRCD(fd, oflags)
	runtime.KeepAlive(f) // its descriptor stays open until the device has seen it
	if err != nil {
		c.unregister(h)
		return nil, fmt.Errorf("open xrcd: %w", c.notSupported(err))
	}
	return &XRCD{ctx: c, ops: ops, handle: h}, nil
}

// Context returns the device the domain was opened on.
func (x *XRCD) Context() *Context { return x.ctx }

// Close drops this reference to the domain; the domain is destroyed with its
// last reference, in any process. It fails with an error wrapping EBUSY
// while SRQs or QPs made or opened through this XRCD are alive.
func (x *XRCD) Close() error {
	return x.life.close(func() error {
		if n := x.users.Load(); n > 0 {
			return fmt.Errorf("close xrcd: %d SRQs and QPs use it: %w", n, syscall.EBUSY)
		}
		if err := x.ops.Close(); err != nil {
			return fmt.Errorf("close xrcd: %w", err)
		}
		x.ctx.unregister(x.handle)
		return nil
	})
}

// CreateXRCSRQ creates an XRC SRQ in the domain xrcd. Its receive buffers
// are memory regions of pd, its completions go to cq, and senders name it by
// SRQ.Num in SendWR.RemoteSRQNum. As with CreateSRQ, attr.SRQLimit is not
// armed at creation.
func (pd *PD) CreateXRCSRQ(xrcd *XRCD, cq *CQ, attr SRQAttr) (*SRQ, error) {
	if xrcd == nil || cq == nil {
		return nil, fmt.Errorf("create xrc srq: an XRC SRQ needs a domain and a CQ: %w", syscall.EINVAL)
	}
	if attr.MaxWR == 0 || attr.MaxSGE == 0 {
		return nil, fmt.Errorf("create xrc srq: max_wr and max_sge must not be 0: %w", syscall.EINVAL)
	}
	c := pd.ctx
	if xrcd.ctx != c || cq.ctx != c {
		return nil, fmt.Errorf("create xrc srq: domain, CQ and PD of different devices: %w", syscall.EINVAL)
	}
	if err := pd.life.alive(); err != nil {
		return nil, fmt.Errorf("create xrc srq: %w", err)
	}
	p, err := c.xrc()
	if err != nil {
		return nil, fmt.Errorf("create xrc srq: %w", err)
	}
	h, err := c.register()
	if err != nil {
		return nil, fmt.Errorf("create xrc srq: %w", err)
	}
	if err := xrcd.life.hold(&xrcd.users); err != nil {
		c.unregister(h)
		return nil, fmt.Errorf("create xrc srq: its domain: %w", err)
	}
	ops, err := p.CreateXRCSRQ(pd.ops, xrcd.ops, cq.ops, SRQInit{Attr: attr, Handle: h})
	if err != nil {
		xrcd.users.Add(-1)
		c.unregister(h)
		return nil, fmt.Errorf("create xrc srq: %w", c.notSupported(err))
	}
	srq := &SRQ{pd: pd, ops: ops, handle: h, xrcd: xrcd}
	c.publish(h, srq)
	return srq, nil
}

// CreateTgtQP creates an XRC receive (TGT) QP in the domain, in the RESET
// state. It has no PD, CQ or queues: the messages it receives go to the
// XRC SRQs of the domain their senders name. The QP belongs to the domain;
// this opener, like those of OpenQP, keeps it alive until closed.
func (x *XRCD) CreateTgtQP() (*QP, error) {
	c := x.ctx
	p, err := c.xrc()
	if err != nil {
		return nil, fmt.Errorf("create xrc tgt qp: %w", err)
	}
	h, err := c.register()
	if err != nil {
		return nil, fmt.Errorf("create xrc tgt qp: %w", err)
	}
	if err := x.life.hold(&x.users); err != nil {
		c.unregister(h)
		return nil, fmt.Errorf("create xrc tgt qp: %w", err)
	}
	ops, err := p.CreateXRCTgtQP(x.ops, h)
	if err != nil {
		x.users.Add(-1)
		c.unregister(h)
		return nil, fmt.Errorf("create xrc tgt qp: %w", c.notSupported(err))
	}
	qp := &QP{ctx: c, xrcd: x, ops: ops, typ: QPTXRCTgt, handle: h, state: QPSReset}
	c.publish(h, qp)
	return qp, nil
}

// OpenQP opens the domain's XRC receive QP numbered num, which another
// process (or this one) created: this process then gets its async events
// and may modify it. Closing the returned QP closes this opener only; the
// QP is destroyed with its last opener. A number that names no receive QP
// of the domain fails with EINVAL.
func (x *XRCD) OpenQP(num uint32) (*QP, error) {
	c := x.ctx
	p, err := c.xrc()
	if err != nil {
		return nil, fmt.Errorf("open qp %#x: %w", num, err)
	}
	h, err := c.register()
	if err != nil {
		return nil, fmt.Errorf("open qp %#x: %w", num, err)
	}
	if err := x.life.hold(&x.users); err != nil {
		c.unregister(h)
		return nil, fmt.Errorf("open qp %#x: %w", num, err)
	}
	ops, err := p.OpenXRCQP(x.ops, num, h)
	if err != nil {
		x.users.Add(-1)
		c.unregister(h)
		return nil, fmt.Errorf("open qp %#x: %w", num, c.notSupported(err))
	}
	qp := &QP{ctx: c, xrcd: x, ops: ops, typ: QPTXRCTgt, handle: h, state: QPSReset}
	if st, err := qp.queryState(); err == nil {
		qp.state = st
	}
	c.publish(h, qp)
	return qp, nil
}
