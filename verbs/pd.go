package verbs

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/xrcrun/xrc/internal/unix"
)

// PD is a protection domain: memory regions, SRQs and QPs of one PD may
// only be used together.
type PD struct {
	ctx    *Context
	ops    ProviderPD
	handle uint64
	life   lifecycle
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	h, err := c.register()
	if err != nil {
		return nil, fmt.Errorf("alloc pd: %w", err)
	}
	ops, err := c.prov.AllocPD()
	if err != nil {
		c.unregister(h)
		return nil, fmt.Errorf("alloc pd: %w", err)
	}
	return &PD{ctx: c, ops: ops, handle: h}, nil
}

// Context returns the device the PD belongs to.
func (pd *PD) Context() *Context { return pd.ctx }

// Close deallocates the PD. It fails with an error wrapping EBUSY while
// memory regions, SRQs or QPs use it.
func (pd *PD) Close() error {
	return pd.life.close(func() error {
		if err := pd.ops.Dealloc(); err != nil {
			return fmt.Errorf("dealloc pd: %w", err)
		}
		pd.ctx.unregister(pd.handle)
		return nil
	})
}

// MR is a registered memory region. Its memory must stay valid until Close;
// for Go memory RegMR pins it.
type MR struct {
	pd     *PD
	ops    ProviderMR
	buf    []byte
	handle uint64
	pin    runtime.Pinner
	alloc  *allocation // the Alloc mapping holding buf, if any
	life   lifecycle
}

// RegMR registers buf with the given access. buf may come from Alloc or be
// any Go slice, which stays pinned until the region is closed. Remote write
// and remote atomic access require local write, as in ibverbs.
func (pd *PD) RegMR(buf []byte, access Access) (*MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("reg mr: empty buffer: %w", syscall.EINVAL)
	}
	if access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && access&AccessLocalWrite == 0 {
		return nil, fmt.Errorf("reg mr: remote write or atomic access (%v) requires LOCAL_WRITE: %w", access, syscall.EINVAL)
	}
	if err := pd.life.alive(); err != nil {
		return nil, fmt.Errorf("reg mr: %w", err)
	}
	h, err := pd.ctx.register()
	if err != nil {
		return nil, fmt.Errorf("reg mr: %w", err)
	}
	mr := &MR{pd: pd, buf: buf, handle: h}
	addr := unix.AddrOf(buf)
	mr.alloc = holdAlloc(addr, uint64(len(buf)))
	if mr.alloc == nil {
		mr.pin.Pin(&buf[0])
	}
	mr.ops, err = pd.ops.RegMR(addr, uint64(len(buf)), access)
	if err != nil {
		mr.release()
		pd.ctx.unregister(h)
		return nil, fmt.Errorf("reg mr of %d bytes: %w", len(buf), err)
	}
	return mr, nil
}

func (mr *MR) release() {
	if mr.alloc != nil {
		mr.alloc.release()
		mr.alloc = nil
	} else {
		mr.pin.Unpin()
	}
}

// LKey is the local key, for SGEs of local work requests.
func (mr *MR) LKey() uint32 { return mr.ops.LKey() }

// RKey is the remote key, which peers use to reach the region.
func (mr *MR) RKey() uint32 { return mr.ops.RKey() }

// Bytes is the registered memory.
func (mr *MR) Bytes() []byte { return mr.buf }

// Addr is the address of the first registered byte, as peers name it.
func (mr *MR) Addr() uint64 { return uint64(unix.AddrOf(mr.buf)) }

// SGE returns a scatter/gather element for n bytes at offset off.
func (mr *MR) SGE(off, n int) SGE {
	return SGE{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.LKey()}
}

// Close deregisters the region and unpins its memory.
func (mr *MR) Close() error {
	return mr.life.close(func() error {
		if err := mr.ops.Dereg(); err != nil {
			return fmt.Errorf("dereg mr: %w", err)
		}
		mr.release()
		mr.pd.ctx.unregister(mr.handle)
		return nil
	})
}

// lifecycle makes Close idempotent: the destroy function runs until it
// succeeds once.
type lifecycle struct {
	mu     sync.Mutex
	closed bool // guarded by mu
}

// alive reports ErrClosed once the object is closed: a handle closed may
// name another object by now.
func (l *lifecycle) alive() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	return nil
}

// hold counts one more user in users unless the object is closed, as one
// step with respect to close, whose destroy checks the count.
func (l *lifecycle) hold(users *atomic.Int32) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	users.Add(1)
	return nil
}

func (l *lifecycle) close(destroy func() error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	if err := destroy(); err != nil {
		return err
	}
	l.closed = true
	return nil
}
