//go:build linux

package softhca

import (
	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
)

// Device identity and capabilities as QUERY_DEVICE reports them.
const (
	vendorID     = 0xffffff // not a hardware vendor
	vendorPartID = 4099     // ConnectX-3's part: the WQE and CQE formats it speaks
	fwVer        = 1<<32 | 0<<16 | 0
	deviceCaps   = uverbs.DeviceBadPkeyCntr | uverbs.DeviceBadQkeyCntr | uverbs.DevicePortActiveEvent |
		uverbs.DeviceSysImageGUID | uverbs.DeviceRCRNRNakGen | uverbs.DeviceXRC
	cqeSize = 32
)

func (d *Device) cmdGetContext(r *request) ([]byte, error) {
	if _, _, err := payload[uverbs.GetContext](r); err != nil {
		return nil, err
	}
	c := r.c
	if c.hasContext {
		return nil, unix.Error(unix.EINVAL, "context already allocated")
	}
	id := c.eventID(c.asyncUser)
	core := uverbs.GetContextResp{AsyncFD: uint32(id), NumCompVectors: numCompVectors}
	drv := mlx4abi.IBAllocUcontextResp{QPTabSize: maxQP, CQESize: cqeSize}
	resp, err := response(r, &core, &drv)
	if err != nil {
		return nil, err
	}
	c.hasContext = true
	c.handedOut = append(c.handedOut, handedFile{fd: c.asyncUser, id: id})
	c.asyncUser = -1 // the client owns it now
	return resp, nil
}

func (d *Device) cmdQueryDevice(r *request) ([]byte, error) {
	if _, _, err := payload[uverbs.QueryDevice](r); err != nil {
		return nil, err
	}
	be := func(v uint64) uint64 { return nativeBE64(v) }
	a := uverbs.QueryDeviceResp{
		FwVer: fwVer, NodeGUID: be(d.guid), SysImageGUID: be(d.guid), MaxMRSize: maxMRSize,
		PageSizeCap: uint64(unix.PageSize), VendorID: vendorID, VendorPartID: vendorPartID,
		MaxQP: maxQP, MaxQPWR: maxQPWR, DeviceCapFlags: deviceCaps, MaxSGE: maxSGE, MaxSGERd: maxSGE,
		MaxCQ: maxCQ, MaxCQE: maxCQE, MaxMR: maxMR, MaxPD: maxPD, MaxQPRdAtom: maxQPRdAtom,
		MaxResRdAtom: maxQPRdAtom * maxQP, MaxQPInitRdAtom: maxQPInitRdAtm, AtomicCap: 1, // IBV_ATOMIC_HCA
		MaxSRQ: maxSRQ, MaxSRQWR: maxSRQWR, MaxSRQSGE: maxSRQSGE, MaxPkeys: 1,
		LocalCaAckDelay: 15, PhysPortCnt: 1,
	}
	return response[uverbs.QueryDeviceResp, noDriver](r, &a, nil)
}

func (d *Device) cmdQueryPort(r *request) ([]byte, error) {
	req, _, err := payload[uverbs.QueryPort](r)
	if err != nil {
		return nil, err
	}
	if req.PortNum != 1 {
		return nil, unix.Errorf(unix.EINVAL, "port %d: the device has port 1", req.PortNum)
	}
	p := uverbs.QueryPortResp{
		PortCapFlags: uverbs.PCFCMSup | uverbs.PCFIPBasedGIDs, MaxMsgSz: 1 << 31,
		GIDTblLen: 1, PkeyTblLen: 1, State: 4 /* ACTIVE */, MaxMTU: 5, ActiveMTU: mtuEnum(d.mtu),
		MaxVLNum: 1, ActiveWidth: 1 /* 1X */, ActiveSpeed: 32 /* EDR: 25 Gb/s */, PhysState: 5, /* LinkUp */
		LinkLayer: 2 /* Ethernet */, Flags: uverbs.QPFGRHRequired,
	}
	if !d.portUp.Load() {
		p.State, p.PhysState = 1 /* DOWN */, 3 /* Disabled */
	}
	return response[uverbs.QueryPortResp, noDriver](r, &p, nil)
}

// pd is a protection domain.
type pd struct {
	num    uint32
	client *Client
	usecnt int // MRs, SRQs and QPs using it
}

func (d *Device) cmdAllocPD(r *request) ([]byte, error) {
	if _, _, err := payload[uverbs.AllocPD](r); err != nil {
		return nil, err
	}
	if len(d.pds) >= maxPD {
		return nil, unix.Error(unix.ENOMEM, "too many PDs")
	}
	p := &pd{num: d.nextPDN, client: r.c}
	core := uverbs.AllocPDResp{}
	drv := mlx4abi.IBAllocPDResp{PDN: p.num}
	if r.outLen < int(unsafeSize(core)) {
		return nil, unix.Error(unix.ENOSPC, "no room for the response")
	}
	d.nextPDN++
	d.pds[p.num] = p
	core.PDHandle = r.c.addObject(p)
	return response(r, &core, &drv)
}

func (d *Device) cmdDeallocPD(r *request) ([]byte, error) {
	req, _, err := payload[uverbs.DeallocPD](r)
	if err != nil {
		return nil, err
	}
	p, err := object[*pd](r.c, req.PDHandle)
	if err != nil {
		return nil, err
	}
	if err := d.destroyPD(p); err != nil {
		return nil, err
	}
	delete(r.c.objs, req.PDHandle)
	return nil, nil
}

func (d *Device) destroyPD(p *pd) error {
	if p.usecnt > 0 {
		return unix.Errorf(unix.EBUSY, "pd %d is used by %d objects", p.num, p.usecnt)
	}
	delete(d.pds, p.num)
	return nil
}

// Access flags of memory regions and QPs.
const (
	accLocalWrite   = uverbs.AccessLocalWrite
	accRemoteWrite  = uverbs.AccessRemoteWrite
	accRemoteRead   = uverbs.AccessRemoteRead
	accRemoteAtomic = uverbs.AccessRemoteAtomic
	accKnown        = accLocalWrite | accRemoteWrite | accRemoteRead | accRemoteAtomic
)

// mr is a memory region. Its local and remote keys are the same value: an
// index in the device's table (the upper 24 bits) and a tag that changes
// each time the index is reused.
type mr struct {
	key    uint32
	pd     *pd
	client *Client
	iova   uint64 // the address work requests use for the first byte
	addr   uint64 // where the first byte is in the client's memory
	length uint64
	access uint32
	view   []byte // direct access to the memory, when the client is local
	dead   bool   // deregistered: work requests that still hold it fail
}

func (d *Device) cmdRegMR(r *request) ([]byte, error) {
	req, _, err := payload[uverbs.RegMR](r)
	if err != nil {
		return nil, err
	}
	p, err := object[*pd](r.c, req.PDHandle)
	if err != nil {
		return nil, err
	}
	if req.AccessFlags&^accKnown != 0 {
		return nil, unix.Errorf(unix.EINVAL, "access flags %#x: unsupported bits", req.AccessFlags)
	}
	if req.AccessFlags&(accRemoteWrite|accRemoteAtomic) != 0 && req.AccessFlags&accLocalWrite == 0 {
		return nil, unix.Error(unix.EINVAL, "remote write or atomic access without local write")
	}
	if req.Length == 0 || req.Length > maxMRSize || req.Start+req.Length < req.Start || req.HCAVA+req.Length < req.HCAVA {
		return nil, unix.Errorf(unix.EINVAL, "region of %d bytes at %#x", req.Length, req.Start)
	}
	if len(d.mrs) >= maxMR {
		return nil, unix.Error(unix.ENOMEM, "too many memory regions")
	}
	mc := r.mapped // read by run's prepare, which parsed the same payload
	if mc.err != nil {
		return nil, mc.err
	}
	view, err := r.c.mem.region(req.Start, req.Length, mc.fm)
	if err != nil {
		return nil, err
	}
	var core uverbs.RegMRResp
	if r.outLen < int(unsafeSize(core)) {
		return nil, unix.Error(unix.ENOSPC, "no room for the response")
	}
	idx := d.allocMRIndex()
	d.keyTag++
	m := &mr{key: idx<<8 | uint32(d.keyTag), pd: p, client: r.c, iova: req.HCAVA, addr: req.Start,
		length: req.Length, access: req.AccessFlags, view: view}
	d.mrs[idx] = m
	p.usecnt++
	r.c.mem.hold(view)
	core = uverbs.RegMRResp{MRHandle: r.c.addObject(m), Lkey: m.key, Rkey: m.key}
	return response[uverbs.RegMRResp, noDriver](r, &core, nil)
}

// regMRWrites says whether a region with these access flags is written,
// and so must be mapped writable.
func regMRWrites(access uint32) bool {
	return access&(accLocalWrite|accRemoteWrite|accRemoteAtomic) != 0
}

// allocMRIndex finds a free key index.
func (d *Device) allocMRIndex() uint32 {
	return allocNum(&d.nextMR, 1, 1<<24, func(i uint32) bool { return d.mrs[i] != nil })
}

func (d *Device) cmdDeregMR(r *request) ([]byte, error) {
	req, _, err := payload[uverbs.DeregMR](r)
	if err != nil {
		return nil, err
	}
	m, err := object[*mr](r.c, req.MRHandle)
	if err != nil {
		return nil, err
	}
	d.destroyMR(m)
	delete(r.c.objs, req.MRHandle)
	return nil, nil
}

func (d *Device) destroyMR(m *mr) {
	delete(d.mrs, m.key>>8)
	m.pd.usecnt--
	m.client.mem.release(m.view)
	m.view = nil
	m.dead = true
}

// lookupMR finds the region of a key; the tag must match too.
func (d *Device) lookupMR(key uint32) *mr {
	m := d.mrs[key>>8]
	if m == nil || m.key != key {
		return nil
	}
	return m
}

func (d *Device) cmdCreateCompChannel(r *request) ([]byte, error) {
	if _, _, err := payload[uverbs.CreateCompChannel](r); err != nil {
		return nil, err
	}
	var core uverbs.CreateCompChannelResp
	if r.outLen < int(unsafeSize(core)) {
		return nil, unix.Error(unix.ENOSPC, "no room for the response")
	}
	fds, err := unix.Socketpair(unix.SOCK_SEQPACKET)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fds[0]); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, err
	}
	ch := &compChannel{dev: fds[0], user: fds[1], refs: 1}
	id := r.c.eventID(fds[1])
	if old := r.c.channels[id]; old != nil {
		// The client closed its end of the old channel, or the number
		// could not have been reused: drop the table's reference.
		old.release()
	}
	if r.c.remote {
		// A remote client's numbers are not reused: drop the table's
		// references to the channels whose end it has closed.
		for oid, old := range r.c.channels {
			if unix.HungUp(old.dev) {
				old.release()
				delete(r.c.channels, oid)
			}
		}
	}
	r.c.channels[id] = ch
	r.c.handedOut = append(r.c.handedOut, handedFile{fd: fds[1], id: id})
	core.FD = uint32(id)
	return response[uverbs.CreateCompChannelResp, noDriver](r, &core, nil)
}
