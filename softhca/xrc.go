//go:build linux

package softhca

import (
	"github.com/xrcrun/xrc/internal/qpstate"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
	"github.com/xrcrun/xrc/softhca/roce"
)

// XRC domains and the objects in them, as the kernel keeps them.
//
// A domain opened from a file is keyed by the file's identity (device and
// inode numbers) and shared by every client of the device that opens the
// same file, in any process; one opened with fd -1 is private to its
// opener. The domain keeps the file open while it lives, as the kernel
// holds the inode: a file removed meanwhile keeps its inode number, which
// a new file would otherwise get, and with it the domain. Each OPEN_XRCD gives the client a handle (a uxrcd); the SRQs and
// QPs made or opened through a handle count against it (CLOSE_XRCD fails
// with EBUSY while they live), and the domain lives while any handle, SRQ
// or receive QP uses it. An XRC receive (TGT) QP belongs to its domain,
// not to a client: the creator and every client that opens it (OPEN_QP)
// hold an opener (a tgtOpen) under their own handle, and the QP is
// destroyed with its last opener, whoever made it.

// xrcd is an XRC domain. Guarded by d.mu.
type xrcd struct {
	num    uint32
	key    fileID
	shared bool           // keyed by a file, in d.xrcds
	file   int            // shared: the device's descriptor of the file, held open
	usecnt int            // open handles, XRC SRQs and receive QPs
	tgts   map[uint32]*qp // its receive QPs, by number
}

// uxrcd is a client's handle to a domain: the uverbs XRCD object.
type uxrcd struct {
	x      *xrcd
	refcnt int // SRQs and QPs made or opened through this handle
}

// tgtOpen is one opener of an XRC receive QP: the handle a client holds.
type tgtOpen struct {
	q          *qp
	client     *Client
	userHandle uint64
	ux         *uxrcd
}

// xrcQPNBit marks the numbers of XRC receive QPs, as mlx4_ib numbers them
// (and CQEs report them).
const xrcQPNBit = 1 << 23

// oflags of OPEN_XRCD.
const (
	oCreat = 0o100
	oExcl  = 0o200
)

func (d *Device) cmdOpenXRCD(r *request) ([]byte, error) {
	req, _, err := payload[uverbs.OpenXRCD](r)
	if err != nil {
		return nil, err
	}
	var resp uverbs.OpenXRCDResp
	if r.outLen < int(unsafeSize(resp)) {
		return nil, unix.Error(unix.ENOSPC, "no room for the response")
	}
	var x *xrcd
	var key fileID
	var file int
	shared := int32(req.FD) != -1
	if shared {
		if key, file, err = r.c.fileKey(int32(req.FD)); err != nil {
			return nil, err
		}
		x = d.xrcds[key]
		if x == nil && req.Oflags&oCreat == 0 {
			return nil, unix.Error(unix.EAGAIN, "the file has no XRC domain and O_CREAT is not set")
		}
		if x != nil && req.Oflags&oExcl != 0 {
			return nil, unix.Error(unix.EINVAL, "the file has an XRC domain and O_EXCL is set")
		}
	}
	if x == nil {
		if d.nXRCD >= maxXRCD {
			return nil, unix.Error(unix.ENOMEM, "too many XRC domains")
		}
		x = &xrcd{num: d.nextXRCD, key: key, shared: shared, file: -1, tgts: map[uint32]*qp{}}
		if shared {
			if x.file, err = unix.Dup(file); err != nil {
				return nil, err
			}
			d.xrcds[key] = x
		}
		d.nextXRCD++
		d.nXRCD++
	}
	x.usecnt++
	resp.XRCDHandle = r.c.addObject(&uxrcd{x: x})
	return response[uverbs.OpenXRCDResp, noDriver](r, &resp, nil)
}

func (d *Device) cmdCloseXRCD(r *request) ([]byte, error) {
	req, _, err := payload[uverbs.CloseXRCD](r)
	if err != nil {
		return nil, err
	}
	ux, err := object[*uxrcd](r.c, req.XRCDHandle)
	if err != nil {
		return nil, err
	}
	if err := d.closeXRCD(ux); err != nil {
		return nil, err
	}
	delete(r.c.objs, req.XRCDHandle)
	return nil, nil
}

// closeXRCD drops a handle to a domain, and the domain with its last use.
func (d *Device) closeXRCD(ux *uxrcd) error {
	if ux.refcnt > 0 {
		return unix.Errorf(unix.EBUSY, "xrcd %d: %d SRQs and QPs use the handle", ux.x.num, ux.refcnt)
	}
	d.putXRCD(ux.x)
	ux.x = nil
	return nil
}

// putXRCD drops one use of a domain; the last destroys it.
func (d *Device) putXRCD(x *xrcd) {
	x.usecnt--
	if x.usecnt > 0 {
		return
	}
	if x.shared {
		delete(d.xrcds, x.key)
		unix.Close(x.file)
	}
	d.nXRCD--
}

// fileKey identifies the file an OPEN_XRCD names by descriptor, and
// returns the device's descriptor of it (the caller's to dup, not to
// close). The descriptor is the client's: in this process, its own; a
// client in another process passes the file itself along with the command.
func (c *Client) fileKey(fd int32) (fileID, int, error) {
	var f int
	switch {
	case c.passed != nil:
		f = c.passed[0]
	case c.remote:
		return fileID{}, -1, unix.Errorf(unix.EBADF, "OPEN_XRCD names descriptor %d, but the client passed no file", fd)
	default:
		f = int(fd)
	}
	if f < 0 {
		return fileID{}, -1, unix.Errorf(unix.EBADF, "descriptor %d", fd)
	}
	_, major, minor, ino, err := unix.FileStat(f)
	if err != nil {
		return fileID{}, -1, unix.Errorf(unix.EBADF, "descriptor %d: %v", fd, err)
	}
	return fileID{major, minor, ino}, f, nil
}

// createTgtQP makes an XRC receive QP in the domain of ux and its first
// opener, the creator's handle. Caller holds d.mu.
func (d *Device) createTgtQP(r *request, req *uverbs.CreateQP) ([]byte, error) {
	ux, err := object[*uxrcd](r.c, req.PDHandle)
	if err != nil {
		return nil, err
	}
	if d.qps.len() >= maxQP {
		return nil, unix.Error(unix.ENOMEM, "too many QPs")
	}
	resp := uverbs.CreateQPResp{}
	if r.outLen < int(unsafeSize(resp)) {
		return nil, unix.Error(unix.ENOSPC, "no room for the response")
	}
	q := &qp{typ: qpstate.XRCTgt, state: qpstate.Reset, port: 1, xrcd: ux.x, xport: roce.TransportXRC}
	q.req.heapIdx = -1
	q.num = d.allocQPN() | xrcQPNBit
	d.qps.add(q)
	ux.x.tgts[q.num] = q
	ux.x.usecnt++
	resp.QPHandle = d.openTgt(r.c, q, ux, req.UserHandle)
	resp.QPN = q.num
	return response[uverbs.CreateQPResp, noDriver](r, &resp, nil)
}

// openTgt adds an opener of q for client c under the domain handle ux and
// returns its handle.
func (d *Device) openTgt(c *Client, q *qp, ux *uxrcd, userHandle uint64) uint32 {
	o := &tgtOpen{q: q, client: c, userHandle: userHandle, ux: ux}
	q.openers = append(q.openers, o)
	ux.refcnt++
	return c.addObject(o)
}

func (d *Device) cmdOpenQP(r *request) ([]byte, error) {
	req, _, err := payload[uverbs.OpenQP](r)
	if err != nil {
		return nil, err
	}
	if qpstate.Type(req.QPType) != qpstate.XRCTgt {
		return nil, unix.Errorf(unix.EINVAL, "open of a %v QP: only XRC receive QPs are shared", qpstate.Type(req.QPType))
	}
	ux, err := object[*uxrcd](r.c, req.PDHandle)
	if err != nil {
		return nil, err
	}
	q := ux.x.tgts[req.QPN]
	if q == nil {
		return nil, unix.Errorf(unix.EINVAL, "xrcd %d has no receive QP %#x", ux.x.num, req.QPN)
	}
	resp := uverbs.CreateQPResp{QPN: q.num}
	if r.outLen < int(unsafeSize(resp)) {
		return nil, unix.Error(unix.ENOSPC, "no room for the response")
	}
	resp.QPHandle = d.openTgt(r.c, q, ux, req.UserHandle)
	return response[uverbs.CreateQPResp, noDriver](r, &resp, nil)
}

// closeTgt drops an opener of an XRC receive QP, and the QP with its last
// opener. Caller holds d.mu.
func (d *Device) closeTgt(o *tgtOpen) {
	q := o.q
	for i, x := range q.openers {
		if x == o {
			q.openers = append(q.openers[:i], q.openers[i+1:]...)
			break
		}
	}
	o.ux.refcnt--
	if len(q.openers) == 0 {
		d.destroyQP(q)
	}
}

// qpEvent raises an async event of a QP: with every opener of an XRC
// receive QP, each under its own handle, as the kernel's shared QP event
// handler does.
func (d *Device) qpEvent(q *qp, typ uint32) {
	if q.typ != qpstate.XRCTgt {
		q.client.asyncEvent(q.userHandle, typ)
		return
	}
	for _, o := range q.openers {
		o.client.asyncEvent(o.userHandle, typ)
	}
}

// xrcSRQ returns the XRC SRQ numbered srqn if it serves the domain of the
// receive QP q, or nil.
func (d *Device) xrcSRQ(q *qp, srqn uint32) *srq {
	s := d.srqs[srqn]
	if s == nil || s.xrcd == nil || s.xrcd != q.xrcd {
		return nil
	}
	return s
}

// qpObject resolves a QP handle: a QP of the client's, or its opener of an
// XRC receive QP.
func qpObject(c *Client, h uint32) (*qp, *tgtOpen, error) {
	switch o := c.objs[h].(type) {
	case *qp:
		return o, nil, nil
	case *tgtOpen:
		return o.q, o, nil
	}
	return nil, nil, unix.Errorf(unix.EINVAL, "no QP with handle %d", h)
}

// bindXRCSRQ checks the XRCETH of a request packet to the XRC receive QP q:
// it must name an XRC SRQ of q's domain, the same for every packet of a
// message. The first packet of a message binds the message to it. Another
// SRQ (of another domain, not an XRC SRQ, or none) fails the QP with a
// Remote Access NAK: the requester is not entitled to it, as a key of
// another PD is not. (rxe's XRC patches, RESPST_ERR_INVALID_XRCETH, answer
// the same way.) It reports whether the packet goes on.
func (d *Device) bindXRCSRQ(q *qp, p *roce.Packet) bool {
	s := &q.resp
	x := d.xrcSRQ(q, p.XRCSRQ)
	switch {
	case x == nil:
		d.counters.XRCSRQErrors.Add(1)
		d.fatal(q, p, roce.NakRemoteAccess)
		return false
	case s.inMsg && x != s.xsrq:
		d.fatal(q, p, roce.NakInvalidRequest)
		return false
	case x.cq.errored:
		// Its completion would have nowhere to go (failCQUsers).
		d.failCQUser(q)
		return false
	}
	s.xsrq = x
	return true
}

// respPD is the PD that the keys of a request to q must belong to: the
// QP's, or for an XRC receive QP that of the SRQ the request names.
func (q *qp) respPD() *pd {
	if q.xrcd != nil {
		if q.resp.xsrq == nil {
			return nil
		}
		return q.resp.xsrq.pd
	}
	return q.pd
}

// recvCQ is where the receive completions of q go, and what their CQEs
// carry in the low bits of g_mlpath_rqpn: the receive CQ and the remote QP
// number, or for an XRC receive QP the CQ and the number of the SRQ of the
// message (mlx4 reports XRC receives so).
func (q *qp) recvCQ() (*cq, uint32) {
	if q.xrcd != nil {
		return q.resp.xsrq.cq, q.resp.xsrq.num
	}
	return q.rcq, q.destQPN
}
