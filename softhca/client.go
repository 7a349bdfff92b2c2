//go:build linux

package softhca

import (
	"errors"
	"fmt"

	"github.com/xrcrun/xrc/internal/unix"
)

// Client is one open uverbs file of the device: the user context of one
// process (or one verbs.Context in a process). It owns handles and the
// objects created through them; Close destroys them all, as the kernel does
// when the file is released.
type Client struct {
	d   *Device
	mem memory

	// Guarded by d.mu.
	closed     bool
	hasContext bool
	objs       map[uint32]any // handle -> *pd, *mr, *cq, *srq, *qp, *tgtOpen, *uxrcd
	nextHandle uint32
	channels   map[int32]*compChannel // by the fd number the client was given
	asyncDev   int                    // the device's end of the async event socket
	asyncUser  int                    // the client's end, until GET_CONTEXT hands it out
	handedOut  []handedFile           // event files given to the client since takeHandedOut
	lastID     int32                  // the last event file id given to a remote client
	// remote: the client is in another process, whose descriptor numbers
	// mean nothing here; passed holds the files it passed along with the
	// command being run (OPEN_XRCD's), nil when none.
	remote bool
	passed []int
}

// memory is how the device reaches a client's memory.
type memory interface {
	// queue returns [addr, addr+n) of queue memory the client shares with
	// the device, or an EFAULT error.
	queue(addr uint64, n int) ([]byte, error)
	// mapping checks that [addr, addr+n) may be registered (mapped, and
	// writable when write is set) and says what maps it. It reads
	// /proc/<pid>/maps, which takes as long as the client's map is large or
	// busy: callers do not hold d.mu.
	mapping(addr, n uint64, write bool) (fileMapping, error)
	// region returns a direct view of [addr, addr+n), which mapping found
	// mapped by fm, when the device can access it directly, or nil.
	region(addr, n uint64, fm fileMapping) ([]byte, error)
	// hold and release count the memory regions that use a view region
	// returned, so that memory the device mapped for it stays mapped.
	hold(view []byte)
	release(view []byte)
	// read and write copy between the client's memory and b.
	read(addr uint64, b []byte) error
	write(addr uint64, b []byte) error
	// readv copies the bytes at addr into the buffers of bs in turn, as
	// read would into their concatenation; writev copies the buffers in
	// turn to addr.
	readv(addr uint64, bs [][]byte) error
	writev(addr uint64, bs [][]byte) error
	// close releases what the memory holds.
	close()
}

// connect adds a client to the device.
func (d *Device) connect(mem memory) (*Client, error) {
	fds, err := unix.Socketpair(unix.SOCK_SEQPACKET)
	if err != nil {
		return nil, fmt.Errorf("async event socket: %w", err)
	}
	if err := unix.SetNonblock(fds[0]); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, err
	}
	c := &Client{d: d, mem: mem, objs: map[uint32]any{}, channels: map[int32]*compChannel{},
		asyncDev: fds[0], asyncUser: fds[1]}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, ErrClosed
	}
	d.clients[c] = struct{}{}
	return c, nil
}

// addObject gives obj a handle. Caller holds d.mu.
func (c *Client) addObject(obj any) uint32 {
	c.nextHandle++
	c.objs[c.nextHandle] = obj
	return c.nextHandle
}

// object finds the object of a handle with the wanted type. Caller holds
// d.mu.
func object[T any](c *Client, h uint32) (T, error) {
	o, ok := c.objs[h].(T)
	if !ok {
		var zero T
		return zero, unix.Errorf(unix.EINVAL, "no %T with handle %d", zero, h)
	}
	return o, nil
}

// handedFile is an event file given to the client: the device's
// descriptor of the client's end, and the number commands name it by.
type handedFile struct {
	fd int
	id int32
}

// eventID returns the number by which the client knows the client end fd
// of an event file. A client in this process has the descriptor itself. A
// client in another process gets fd passed, and the device then closes its
// copy, whose number another file soon takes here while the client still
// has this one: it gets a number of its own, never reused. Caller holds
// d.mu.
func (c *Client) eventID(fd int) int32 {
	if !c.remote {
		return int32(fd)
	}
	c.lastID++
	return c.lastID
}

// takeHandedOut returns the event files given to the client since the
// last call. A client in another process gets them passed over its socket,
// and the device then closes its copies.
func (c *Client) takeHandedOut() []handedFile {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	fds := c.handedOut
	c.handedOut = nil
	return fds
}

// usesQueue reports whether a live object of the client has its queue
// memory or doorbell record in b. Caller holds d.mu.
func (c *Client) usesQueue(b []byte) bool {
	lo := unix.AddrOf(b)
	hi := lo + uintptr(len(b))
	in := func(x []byte) bool {
		a := unix.AddrOf(x)
		return len(x) > 0 && a < hi && a+uintptr(len(x)) > lo
	}
	for _, o := range c.objs {
		switch o := o.(type) {
		case *cq:
			if in(o.buf) || in(o.db) {
				return true
			}
		case *srq:
			if in(o.buf) || in(o.db) {
				return true
			}
		case *qp:
			if in(o.sq.buf) || in(o.rq.buf) || in(o.rqDB) {
				return true
			}
		}
	}
	return false
}

// asyncEvent queues an async event record for the client. Caller holds
// d.mu.
func (c *Client) asyncEvent(element uint64, typ uint32) {
	if c.closed {
		return
	}
	var rec [16]byte
	putNE64(rec[0:], element)
	putNE32(rec[8:], typ)
	if _, err := unix.Write(c.asyncDev, rec[:]); err != nil {
		c.d.counters.EventsDropped.Add(1)
	}
}

// Close destroys every object of the client, in the order the kernel does
// (QPs before the SRQs and CQs they use, MRs before PDs), and closes its
// event files.
func (c *Client) Close() error {
	d := c.d
	d.mu.Lock()
	if c.closed {
		d.mu.Unlock()
		return nil
	}
	var errs []error
	destroyAll := func(kind string, destroy func(h uint32, o any) (bool, error)) {
		for h, o := range c.objs {
			ok, err := destroy(h, o)
			if err != nil {
				errs = append(errs, fmt.Errorf("destroy %s %d: %w", kind, h, err))
			}
			if ok {
				delete(c.objs, h)
			}
		}
	}
	destroyAll("qp", func(h uint32, o any) (bool, error) {
		switch o := o.(type) {
		case *qp:
			d.destroyQP(o)
		case *tgtOpen:
			d.closeTgt(o)
		default:
			return false, nil
		}
		return true, nil
	})
	destroyAll("srq", func(h uint32, o any) (bool, error) {
		s, ok := o.(*srq)
		if ok {
			return true, d.destroySRQ(s)
		}
		return false, nil
	})
	destroyAll("xrcd", func(h uint32, o any) (bool, error) {
		x, ok := o.(*uxrcd)
		if ok {
			return true, d.closeXRCD(x)
		}
		return false, nil
	})
	destroyAll("cq", func(h uint32, o any) (bool, error) {
		q, ok := o.(*cq)
		if ok {
			return true, d.destroyCQ(q)
		}
		return false, nil
	})
	destroyAll("mr", func(h uint32, o any) (bool, error) {
		m, ok := o.(*mr)
		if ok {
			d.destroyMR(m)
		}
		return ok, nil
	})
	destroyAll("pd", func(h uint32, o any) (bool, error) {
		p, ok := o.(*pd)
		if ok {
			return true, d.destroyPD(p)
		}
		return false, nil
	})
	for fd, ch := range c.channels {
		ch.release()
		delete(c.channels, fd)
	}
	c.closed = true
	delete(d.clients, c)
	unix.Close(c.asyncDev)
	if c.asyncUser >= 0 {
		unix.Close(c.asyncUser)
	}
	d.mu.Unlock()
	c.mem.close()
	return errors.Join(errs...)
}

// compChannel is a completion event channel: a socket pair whose client end
// the client reads struct ib_uverbs_comp_event_desc records from. The
// device's end stays open while the client's table or a CQ refers to it.
type compChannel struct {
	dev  int // the device's end
	user int // the client's end (the client closes it)
	refs int // guarded by d.mu
}

func (ch *compChannel) send(handle uint64) error {
	var rec [8]byte
	putNE64(rec[:], handle)
	_, err := unix.Write(ch.dev, rec[:])
	return err
}

func (ch *compChannel) release() {
	ch.refs--
	if ch.refs == 0 {
		unix.Close(ch.dev)
	}
}
