package verbsx

import (
	"errors"
	"fmt"

	"github.com/xrcrun/xrc/verbs"
)

// Sizes are the buffer and queue sizes of a verbs transport.
type Sizes struct {
	// EagerSize is the size of each receive and send buffer, and so the
	// largest frame (default 8 KiB + 64 bytes, for comm's header).
	EagerSize int
	// SRQDepth is the number of receive buffers posted to the SRQ
	// (default 512).
	SRQDepth int
	// SendSlots is the number of registered send buffers (default 256).
	SendSlots int
	// SendDepth is the send queue of each QP (default 64).
	SendDepth int
}

// Defaults of Sizes.
const (
	DefaultEagerSize = 8<<10 + 64
	DefaultSRQDepth  = 512
	DefaultSendSlots = 256
	DefaultSendDepth = 64
)

// Check sets the defaults of the zero sizes and checks the ranges.
func (s *Sizes) Check() error {
	if s.EagerSize == 0 {
		s.EagerSize = DefaultEagerSize
	}
	if s.SRQDepth == 0 {
		s.SRQDepth = DefaultSRQDepth
	}
	if s.SendSlots == 0 {
		s.SendSlots = DefaultSendSlots
	}
	if s.SendDepth == 0 {
		s.SendDepth = DefaultSendDepth
	}
	switch {
	case s.EagerSize < 64 || s.EagerSize > 1<<20:
		return fmt.Errorf("eager size %d: 64 bytes to 1 MiB", s.EagerSize)
	case s.SRQDepth < 8 || s.SRQDepth > 16000:
		return fmt.Errorf("SRQ depth %d: 8 to 16000", s.SRQDepth)
	case s.SendSlots < 1 || s.SendSlots > 1<<16:
		return fmt.Errorf("%d send slots: 1 to 65536", s.SendSlots)
	case s.SendDepth < 8 || s.SendDepth > 4096:
		return fmt.Errorf("send depth %d: 8 to 4096", s.SendDepth)
	}
	return nil
}

// CoreConfig says what NewCore makes.
type CoreConfig struct {
	Device *verbs.Context
	Port   uint8
	Sizes
	// CQE is the size of the CQ, which takes the completions of the SRQ
	// and of every send queue.
	CQE int
	// NewSRQ makes the SRQ, of pd, completing into cq (for an XRC SRQ).
	NewSRQ func(pd *verbs.PD, cq *verbs.CQ) (*verbs.SRQ, error)
}

// Core is what every verbs transport of a rank holds besides its QPs: the
// port's attributes, a PD, a completion channel and the CQ, the SRQ and its
// receive buffers, the send buffers, the registration cache and the
// Reads. It owns them until Close.
type Core struct {
	Port verbs.PortAttr
	port uint8 // the port's number
	// MaxRd is the RDMA READs a QP keeps outstanding.
	MaxRd int

	PD    *verbs.PD
	Ch    *verbs.CompChannel
	CQ    *verbs.CQ
	Recv  *RecvPool
	Send  *SendPool
	Cache *RegCache
	Reads *Reads

	// Dead says the device failed (Endpoint.failAll): Poll polls what the
	// CQ holds but posts no receive buffer and arms no limit (commands a
	// dead device refuses), since nothing more will come.
	Dead bool

	wc []verbs.WorkCompletion
}

// NewCore queries the device and port and makes the shared objects; the
// receive buffers are posted with the WR ids WRRecv|index. On error the
// returned Core is to be closed.
func NewCore(cfg CoreConfig) (*Core, error) {
	c := &Core{port: cfg.Port, wc: make([]verbs.WorkCompletion, 32)}
	dev := cfg.Device
	attr, err := dev.QueryDevice()
	if err != nil {
		return c, err
	}
	if c.Port, err = dev.QueryPort(cfg.Port); err != nil {
		return c, err
	}
	if c.Port.State != verbs.PortActive {
		return c, fmt.Errorf("port %d of %s is %v", cfg.Port, dev.Name(), c.Port.State)
	}
	c.MaxRd = max(1, int(min(16, attr.MaxQPInitRdAtom, attr.MaxQPRdAtom)))
	if uint32(cfg.SRQDepth) > attr.MaxSRQWR {
		return c, fmt.Errorf("SRQ depth %d: %s takes at most %d", cfg.SRQDepth, dev.Name(), attr.MaxSRQWR)
	}
	if uint32(cfg.SendDepth) > attr.MaxQPWR {
		return c, fmt.Errorf("send depth %d: %s takes at most %d", cfg.SendDepth, dev.Name(), attr.MaxQPWR)
	}
	if c.PD, err = dev.AllocPD(); err != nil {
		return c, err
	}
	if c.Ch, err = dev.CreateCompChannel(); err != nil {
		return c, err
	}
	if c.CQ, err = dev.CreateCQ(cfg.CQE, c.Ch, 0); err != nil {
		return c, err
	}
	srq, err := cfg.NewSRQ(c.PD, c.CQ)
	if err != nil {
		return c, err
	}
	if c.Recv, err = NewRecvPool(c.PD, srq, cfg.SRQDepth, cfg.EagerSize, WRRecv); err != nil {
		return c, err
	}
	if c.Send, err = NewSendPool(c.PD, cfg.SendSlots, cfg.EagerSize); err != nil {
		return c, err
	}
	c.Cache = NewRegCache(c.PD)
	c.Reads = NewReads(c.Cache)
	return c, nil
}

// pollRounds bounds the CQ polls of one Poll, so that a flood of
// completions does not keep the caller from its other transports.
const pollRounds = 8

// Poll polls the CQ and hands each completion to fn, which returns how
// many frames or reads it delivered; then it reposts the free receive
// buffers and arms the SRQ limit again if it fired. It returns the sum of
// fn's results, and whether it stopped with completions left (pollRounds).
func (c *Core) Poll(fn func(*verbs.WorkCompletion) int, m *Metrics) (n int, more bool, err error) {
	for range pollRounds {
		k, err := c.CQ.Poll(c.wc)
		if err != nil {
			return n, false, fmt.Errorf("poll CQ: %w", err)
		}
		for i := range k {
			n += fn(&c.wc[i])
		}
		if more = k == len(c.wc); !more {
			break
		}
	}
	if c.Dead {
		return n, more, nil
	}
	posted, err := c.Recv.Refill()
	m.SRQPosted.Set(float64(posted))
	if err != nil {
		return n, more, err
	}
	return n, more, c.Recv.Rearm(posted)
}

// Queue entry sizes of the estimate of QueueBytes, from the layout of the
// mlx4 provider: send WQEs of 128 bytes (control segment, two data
// segments or 96 inline bytes), SRQ WQEs of 32 bytes (next segment and
// one data segment), CQEs of 32 bytes.
const (
	SendWQEBytes = 128
	SRQWQEBytes  = 32
	CQEBytes     = 32
)

// QueueBytes estimates the queue memory of sendQueues send queues of
// depth entries, the SRQ and the CQ.
func (c *Core) QueueBytes(sendQueues, depth int) int64 {
	return int64(sendQueues*depth*SendWQEBytes + c.Recv.N*SRQWQEBytes + c.CQ.CQE()*CQEBytes)
}

// RegisteredBytes is the memory registered: receive and send buffers and
// the registration cache's regions.
func (c *Core) RegisteredBytes() int64 {
	return int64(len(c.Recv.Mem)+len(c.Send.Mem)) + c.Cache.Bytes()
}

// Close frees everything the Core holds, the PD last. The QPs using it
// must be destroyed first.
func (c *Core) Close() error {
	var errs []error
	if c.Recv != nil {
		errs = append(errs, c.Recv.Close())
	}
	if c.Send != nil {
		errs = append(errs, c.Send.Close())
	}
	if c.Cache != nil {
		errs = append(errs, c.Cache.Close())
	}
	if c.CQ != nil {
		errs = append(errs, c.CQ.Close())
	}
	if c.Ch != nil {
		errs = append(errs, c.Ch.Close())
	}
	if c.PD != nil {
		errs = append(errs, c.PD.Close())
	}
	return errors.Join(errs...)
}
