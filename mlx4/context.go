//go:build linux

// Package mlx4 is the userspace provider for ConnectX-3 class (mlx4) HCAs:
// it encodes uverbs commands with mlx4's driver data, builds send and receive
// WQEs in queue buffers the process owns, rings doorbells, and decodes CQEs,
// as rdma-core's libmlx4 does. The device behind it is reached through a
// Kernel: the kernel's uverbs file for real hardware, or a software HCA.
//
// # Memory ownership
//
// Queue buffers and doorbell records are allocated by the provider from the
// Kernel (AllocQueue) and shared with the device for the life of the queue.
// A WQE slot belongs to the device from the moment its owner bit is flipped
// until its completion is polled; a CQE slot belongs to the provider from
// the moment the device flips its owner bit until the consumer index
// (written to the CQ's doorbell record) passes it.
package mlx4

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
	"github.com/xrcrun/xrc/verbs"
)

// Context is an open mlx4 device; it implements verbs.Provider.
type Context struct {
	k      Kernel
	conn   *uverbs.Conn
	uar    UAR
	yield  func() // from a Yielder Kernel, or nil
	async  *os.File
	caps   mlx4abi.IBAllocUcontextResp
	cqe    int // CQE size in bytes
	vector uint32

	qps   qpTable       // QPs by number, for CQ polling
	xsrqs numTable[SRQ] // XRC SRQs by number, for CQ polling
	// The SRQ of each QP that receives from one, by QP number: a receive
	// completion of such a QP is found from the number alone, without
	// reading the QP object (with thousands of QPs, a cache miss).
	qpSRQs numTable[SRQ]

	qmem queueMem
	db   dbAllocator
	// packed: the device takes queues packed below a page and does not
	// prefetch send WQEs (Packer).
	packed bool

	attrOnce sync.Once
	attr     verbs.DeviceAttr
	attrErr  error
}

// Open allocates a user context on the device behind k and returns it as a
// verbs provider. The provider owns k from then on and closes it in Close.
func Open(k Kernel) (*Context, error) {
	conn, err := uverbs.NewConn(k)
	if err != nil {
		return nil, err
	}
	c := &Context{k: k, conn: conn}
	if y, ok := k.(Yielder); ok {
		c.yield = y.Yield
	}
	if p, ok := k.(Packer); ok && p.PacksQueues() {
		c.packed = true
	}
	c.qmem.k, c.qmem.packed = k, c.packed
	c.db.m = &c.qmem
	var req uverbs.Cmd[uverbs.GetContext]
	var resp mlx4abi.AllocUcontextResp
	if err := uverbs.Exec(conn, uverbs.CmdGetContext, &req, &resp); err != nil {
		conn.Close()
		return nil, fmt.Errorf("get context: %w", err)
	}
	c.caps = resp.Drv
	c.vector = resp.Core.NumCompVectors
	c.cqe = 32
	if resp.Drv.DevCaps&mlx4abi.UserDevCapLargeCQE != 0 && resp.Drv.CQESize != 0 {
		c.cqe = int(resp.Drv.CQESize)
		if c.cqe != 32 && c.cqe != 64 {
			conn.Close()
			return nil, fmt.Errorf("get context: %w", unix.Errorf(unix.EPROTO, "the device says its CQEs are %d bytes; mlx4 has 32 or 64", c.cqe))
		}
	}
	c.async, err = k.EventFile(int32(resp.Core.AsyncFD), "async")
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("async event file: %w", err)
	}
	c.uar, err = k.MapUAR()
	if err != nil {
		c.async.Close()
		conn.Close()
		return nil, fmt.Errorf("map uar: %w", err)
	}
	return c, nil
}

// Close releases the context.
func (c *Context) Close() error {
	err := c.uar.Close()
	if e := c.db.close(); err == nil {
		err = e
	}
	if e := c.qmem.close(); err == nil {
		err = e
	}
	if e := c.async.Close(); err == nil {
		err = e
	}
	if e := c.conn.Close(); err == nil {
		err = e
	}
	if e := c.k.Close(); err == nil {
		err = e
	}
	return err
}

// AsyncEvents returns the async event file.
func (c *Context) AsyncEvents() *os.File { return c.async }

// QueryDevice issues QUERY_DEVICE.
func (c *Context) QueryDevice() (verbs.DeviceAttr, error) {
	var req uverbs.Cmd[uverbs.QueryDevice]
	var r uverbs.QueryDeviceResp
	if err := uverbs.Exec(c.conn, uverbs.CmdQueryDevice, &req, &r); err != nil {
		return verbs.DeviceAttr{}, err
	}
	return verbs.DeviceAttr{
		FwVer:    fmt.Sprintf("%d.%d.%03d", (r.FwVer>>32)&0xffff, (r.FwVer>>16)&0xffff, r.FwVer&0xffff),
		NodeGUID: be64(r.NodeGUID), SysImageGUID: be64(r.SysImageGUID),
		MaxMRSize: r.MaxMRSize, PageSizeCap: r.PageSizeCap,
		VendorID: r.VendorID, VendorPartID: r.VendorPartID, HWVer: r.HwVer,
		MaxQP: r.MaxQP, MaxQPWR: r.MaxQPWR, DeviceCapFlags: verbs.DeviceCap(r.DeviceCapFlags),
		MaxSGE: r.MaxSGE, MaxSGERd: r.MaxSGERd, MaxCQ: r.MaxCQ, MaxCQE: r.MaxCQE,
		MaxMR: r.MaxMR, MaxPD: r.MaxPD, MaxQPRdAtom: r.MaxQPRdAtom, MaxResRdAtom: r.MaxResRdAtom,
		MaxQPInitRdAtom: r.MaxQPInitRdAtom, AtomicCap: verbs.AtomicCap(r.AtomicCap),
		MaxSRQ: r.MaxSRQ, MaxSRQWR: r.MaxSRQWR, MaxSRQSGE: r.MaxSRQSGE,
		MaxPkeys: r.MaxPkeys, LocalCAAckDelay: r.LocalCaAckDelay, PhysPortCnt: r.PhysPortCnt,
	}, nil
}

// deviceAttr caches QueryDevice for the provider's own size checks.
func (c *Context) deviceAttr() (verbs.DeviceAttr, error) {
	c.attrOnce.Do(func() { c.attr, c.attrErr = c.QueryDevice() })
	return c.attr, c.attrErr
}

// be64 converts a big-endian __be64 field read as a native integer.
func be64(v uint64) uint64 {
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], v)
	return binary.BigEndian.Uint64(b[:])
}

// QueryPort issues QUERY_PORT and reads the port's GID.
func (c *Context) QueryPort(port uint8) (verbs.PortAttr, error) {
	req := uverbs.Cmd[uverbs.QueryPort]{Core: uverbs.QueryPort{PortNum: port}}
	var r uverbs.QueryPortResp
	if err := uverbs.Exec(c.conn, uverbs.CmdQueryPort, &req, &r); err != nil {
		return verbs.PortAttr{}, err
	}
	a := verbs.PortAttr{
		State: verbs.PortState(r.State), MaxMTU: verbs.MTU(r.MaxMTU), ActiveMTU: verbs.MTU(r.ActiveMTU),
		GIDTblLen: r.GIDTblLen, PortCapFlags: r.PortCapFlags, MaxMsgSz: r.MaxMsgSz,
		BadPkeyCntr: r.BadPkeyCntr, QkeyViolCntr: r.QkeyViolCntr, PkeyTblLen: r.PkeyTblLen,
		LID: r.LID, SMLID: r.SmLID, LMC: r.Lmc, MaxVLNum: r.MaxVLNum, SMSL: r.SmSL,
		SubnetTimeout: r.SubnetTimeout, ActiveWidth: r.ActiveWidth, ActiveSpeed: r.ActiveSpeed,
		PhysState: r.PhysState, LinkLayer: verbs.LinkLayer(r.LinkLayer), Flags: r.Flags,
	}
	gid, err := c.k.QueryGID(port, 0)
	if err != nil {
		return a, fmt.Errorf("query gid: %w", err)
	}
	a.GID = gid
	return a, nil
}

func (c *Context) storeQP(qp *QP) error {
	if err := c.qps.store(qp); err != nil {
		return err
	}
	if qp.srq != nil {
		c.qpSRQs.put(qp.qpn, qp.srq)
	}
	return nil
}

func (c *Context) forgetQP(qp *QP) {
	if qp.srq != nil {
		c.qpSRQs.forget(qp.qpn)
	}
	c.qps.forget(qp.qpn)
}
func (c *Context) findQP(qpn uint32) *QP { return c.qps.find(qpn) }

// CreateCompChannel issues CREATE_COMP_CHANNEL.
func (c *Context) CreateCompChannel() (verbs.ProviderChannel, error) {
	var req uverbs.Cmd[uverbs.CreateCompChannel]
	var r uverbs.CreateCompChannelResp
	if err := uverbs.Exec(c.conn, uverbs.CmdCreateCompChannel, &req, &r); err != nil {
		return nil, err
	}
	f, err := c.k.EventFile(int32(r.FD), "comp-channel")
	if err != nil {
		return nil, err
	}
	return &channel{f: f, fd: int32(r.FD)}, nil
}

// channel is a completion channel: the kernel's event file, and the number
// the kernel gave it, which CREATE_CQ names.
type channel struct {
	f  *os.File
	fd int32
}

func (ch *channel) File() *os.File { return ch.f }
func (ch *channel) Close() error   { return ch.f.Close() }

// ring is the memory of a work or completion queue: the queue buffer and
// its doorbell record (nil for queues without one).
type ring struct {
	buf []byte
	db  []byte
}

// allocRing allocates a zeroed queue buffer of n bytes (on whole pages, or
// a small one sharing a page when the device takes packed queues, Packer)
// and, if withDB, a doorbell record.
func (c *Context) allocRing(n int, withDB bool) (ring, error) {
	buf, err := c.qmem.alloc(n)
	if err != nil {
		return ring{}, fmt.Errorf("queue buffer: %w", err)
	}
	r := ring{buf: buf}
	if withDB {
		if r.db, err = c.db.alloc(); err != nil {
			c.qmem.free(buf)
			return ring{}, err
		}
	}
	return r, nil
}

// freeRing releases what allocRing allocated.
func (c *Context) freeRing(r ring) error {
	if r.db != nil {
		c.db.release(r.db)
	}
	return c.qmem.free(r.buf)
}

// destroyed is the error of a destroy command that failed with err: nil
// when err is EIO, which a destroy gets only once the device is gone (the
// kernel answers every command of a context that it disassociated from a
// removed device with EIO, having destroyed the context's objects itself;
// a software HCA that closed, or whose process went away, does the same):
// the object is gone with the device, and the provider frees its own side
// of it (rings, doorbell records, tables), as rdma-core's destroys do
// after IBV_EVENT_DEVICE_FATAL (verbs_is_destroy_err). Other errors are
// the device's refusal: the object lives on.
func destroyed(err error) error {
	if errors.Is(err, unix.EIO) {
		return nil
	}
	return err
}

// addr is the address a command passes for memory the device reaches.
func addr(b []byte) uint64 { return uint64(unix.AddrOf(b)) }

// dbAllocator hands out doorbell records from pages of queue memory. Every
// record takes 8 bytes (a CQ's set_ci and arm words; a receive queue's
// counter uses the first 4).
type dbAllocator struct {
	m     *queueMem
	mu    sync.Mutex
	pages [][]byte // guarded by mu
	free  [][]byte // guarded by mu
}

func (a *dbAllocator) alloc() ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.free) == 0 {
		p, err := a.m.alloc(unix.PageSize)
		if err != nil {
			return nil, fmt.Errorf("doorbell page: %w", err)
		}
		a.pages = append(a.pages, p)
		for off := 0; off+8 <= len(p); off += 8 {
			a.free = append(a.free, p[off:off+8:off+8])
		}
	}
	r := a.free[len(a.free)-1]
	a.free = a.free[:len(a.free)-1]
	clear(r)
	return r, nil
}

func (a *dbAllocator) release(r []byte) {
	a.mu.Lock()
	a.free = append(a.free, r)
	a.mu.Unlock()
}

func (a *dbAllocator) close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var err error
	for _, p := range a.pages {
		if e := a.m.free(p); err == nil {
			err = e
		}
	}
	a.pages, a.free = nil, nil
	return err
}
