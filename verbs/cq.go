package verbs

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/xrcrun/xrc/internal/racedma"
)

// CompChannel delivers completion events of the CQs attached to it.
type CompChannel struct {
	ctx    *Context
	ops    ProviderChannel
	handle uint64
	raw    syscall.RawConn // the event file's descriptor, for TryEvent
	fd     int             // its number, for FD
	cqs    atomic.Int32    // live CQs attached
	life   lifecycle
}

// CreateCompChannel creates a completion event channel.
func (c *Context) CreateCompChannel() (*CompChannel, error) {
	h, err := c.register()
	if err != nil {
		return nil, fmt.Errorf("create comp channel: %w", err)
	}
	ops, err := c.prov.CreateCompChannel()
	if err != nil {
		c.unregister(h)
		return nil, fmt.Errorf("create comp channel: %w", err)
	}
	ch := &CompChannel{ctx: c, ops: ops, handle: h, fd: -1}
	// The descriptor through the file's RawConn: Fd would make the file
	// blocking, and GetEvent's reads could no longer end with ctx.
	if raw, err := ops.File().SyscallConn(); err == nil {
		ch.raw = raw
		raw.Control(func(fd uintptr) { ch.fd = int(fd) })
	}
	return ch, nil
}

// FD is the descriptor of the channel's event file, for a wait in poll(2)
// or ppoll together with other descriptors: it is readable while an event
// waits to be taken (GetEvent, TryEvent). It is -1 if the file has none,
// and stays the channel's until Close.
func (ch *CompChannel) FD() int { return ch.fd }

// TryEvent takes the next completion event of the channel if one is there,
// without waiting, and returns its CQ; nil, nil when there is none. It
// may run while another goroutine waits in GetEvent: each event goes to
// one of them, and the other finds none (the file is non-blocking; this
// reads it directly, GetEvent through Go's network poller).
func (ch *CompChannel) TryEvent() (*CQ, error) {
	if ch.raw == nil {
		return nil, fmt.Errorf("try cq event: the channel's file has no descriptor: %w", syscall.EINVAL)
	}
	var buf [8]byte // struct ib_uverbs_comp_event_desc
	for {
		var n int
		var rerr error
		if err := ch.raw.Control(func(fd uintptr) {
			for {
				n, rerr = syscall.Read(int(fd), buf[:])
				if rerr != syscall.EINTR {
					return
				}
			}
		}); err != nil {
			return nil, fmt.Errorf("try cq event: %w", err)
		}
		switch {
		case rerr == syscall.EAGAIN:
			return nil, nil
		case rerr != nil:
			return nil, fmt.Errorf("try cq event: %w", rerr)
		case n != len(buf):
			return nil, fmt.Errorf("try cq event: short event record: %d of %d bytes", n, len(buf))
		}
		if cq := ch.delivered(buf[:]); cq != nil {
			return cq, nil
		}
	}
}

// GetEvent waits until a CQ attached to the channel has a completion event,
// or until ctx is done, and returns the CQ. The CQ must be armed again (and
// polled) to get its next event. Run one waiter per channel (TryEvent may
// run beside it).
func (ch *CompChannel) GetEvent(ctx context.Context) (*CQ, error) {
	var buf [8]byte // struct ib_uverbs_comp_event_desc
	for {
		if _, err := readEvent(ctx, ch.ops.File(), buf[:]); err != nil {
			return nil, fmt.Errorf("get cq event: %w", err)
		}
		if cq := ch.delivered(buf[:]); cq != nil {
			return cq, nil
		}
	}
}

// delivered returns the CQ an event record (struct
// ib_uverbs_comp_event_desc) names and tells its provider the event was
// read; nil for the event of a CQ closed since, which the reader skips.
func (ch *CompChannel) delivered(rec []byte) *CQ {
	cq, ok := ch.ctx.lookup(binary.NativeEndian.Uint64(rec)).(*CQ)
	if !ok {
		return nil
	}
	cq.ops.EventDelivered()
	return cq
}

// Close destroys the channel. It fails with an error wrapping EBUSY while
// CQs are attached to it.
func (ch *CompChannel) Close() error {
	return ch.life.close(func() error {
		if n := ch.cqs.Load(); n > 0 {
			return fmt.Errorf("destroy comp channel: %d CQs attached: %w", n, syscall.EBUSY)
		}
		if err := ch.ops.Close(); err != nil {
			return fmt.Errorf("destroy comp channel: %w", err)
		}
		ch.ctx.unregister(ch.handle)
		return nil
	})
}

// CQ is a completion queue.
type CQ struct {
	ctx    *Context
	ops    ProviderCQ
	ch     *CompChannel
	handle uint64
	life   lifecycle
}

// CreateCQ creates a CQ holding at least cqe completions. ch may be nil;
// vector selects the completion vector.
func (c *Context) CreateCQ(cqe int, ch *CompChannel, vector int) (*CQ, error) {
	if cqe < 1 {
		return nil, fmt.Errorf("create cq: %d entries: %w", cqe, syscall.EINVAL)
	}
	if ch != nil {
		if ch.ctx != c {
			return nil, fmt.Errorf("create cq: a channel of another context: %w", syscall.EINVAL)
		}
		// Counted under the channel's lock, which Close checks the count
		// under.
		if err := ch.life.hold(&ch.cqs); err != nil {
			return nil, fmt.Errorf("create cq: its channel: %w", err)
		}
	}
	h, err := c.register()
	if err != nil {
		if ch != nil {
			ch.cqs.Add(-1)
		}
		return nil, fmt.Errorf("create cq: %w", err)
	}
	init := CQInit{CQE: cqe, CompVector: vector, Handle: h}
	if ch != nil {
		init.Channel = ch.ops
	}
	ops, err := c.prov.CreateCQ(init)
	if err != nil {
		if ch != nil {
			ch.cqs.Add(-1)
		}
		c.unregister(h)
		return nil, fmt.Errorf("create cq: %w", err)
	}
	cq := &CQ{ctx: c, ops: ops, ch: ch, handle: h}
	c.publish(h, cq)
	return cq, nil
}

// Poll fills wc with up to len(wc) completions, oldest first, and returns how
// many it filled. It does not block or allocate.
func (cq *CQ) Poll(wc []WorkCompletion) (int, error) {
	n, err := cq.ops.Poll(wc)
	if n > 0 {
		// The memory the completed requests named is the program's
		// again (for the race detector: an in-process device copied it).
		racedma.Acquire()
	}
	return n, err
}

// RequestNotify arms the CQ: the next completion (with solicitedOnly, the
// next solicited receive or error completion) generates one event on the
// CQ's channel. Poll after arming, or a completion that arrived before the
// arm may be missed.
func (cq *CQ) RequestNotify(solicitedOnly bool) error {
	if cq.ch == nil {
		return fmt.Errorf("request cq notify: CQ has no completion channel: %w", syscall.EINVAL)
	}
	return cq.ops.Arm(solicitedOnly)
}

// CQE is the number of completions the CQ can hold.
func (cq *CQ) CQE() int { return cq.ops.CQE() }

// Channel is the CQ's completion channel, or nil.
func (cq *CQ) Channel() *CompChannel { return cq.ch }

// Close destroys the CQ. It fails with an error wrapping EBUSY while QPs or
// SRQs use it.
func (cq *CQ) Close() error {
	return cq.life.close(func() error {
		if err := cq.ops.Destroy(); err != nil {
			return fmt.Errorf("destroy cq: %w", err)
		}
		if cq.ch != nil {
			cq.ch.cqs.Add(-1)
		}
		cq.ctx.unregister(cq.handle)
		return nil
	})
}

// alive reports ErrClosed once cq is closed; a nil cq is alive.
func (cq *CQ) alive() error {
	if cq == nil {
		return nil
	}
	return cq.life.alive()
}
