package rc

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/xrcrun/xrc/verbs"
)

// recvPool is the SRQ and its receive buffers: n buffers of size bytes in
// one registered mapping. A buffer belongs to the device while posted,
// to Progress from its completion until the frame is delivered, then it
// is free until posted again. mu guards the free list and the SRQ's
// posting, which both Progress and the SRQ limit event do.
type recvPool struct {
	srq  *verbs.SRQ
	mem  []byte
	mr   *verbs.MR
	size int
	n    int

	mu     sync.Mutex
	free   []uint32 // guarded by mu: buffers not posted
	posted int      // guarded by mu
	wrs    []verbs.RecvWR
	sges   []verbs.SGE
	// fired says the limit event came and the limit is not armed.
	fired atomic.Bool
}

func newRecvPool(pd *verbs.PD, n, size int) (*recvPool, error) {
	p := &recvPool{size: size, n: n}
	var err error
	if p.srq, err = pd.CreateSRQ(verbs.SRQAttr{MaxWR: uint32(n), MaxSGE: 1}); err != nil {
		return p, fmt.Errorf("rc: %w", err)
	}
	if p.mem, err = verbs.Alloc(n * size); err != nil {
		return p, fmt.Errorf("rc: receive buffers: %w", err)
	}
	if p.mr, err = pd.RegMR(p.mem, verbs.AccessLocalWrite); err != nil {
		return p, fmt.Errorf("rc: receive buffers: %w", err)
	}
	for i := range n {
		p.free = append(p.free, uint32(i))
	}
	p.wrs, p.sges = make([]verbs.RecvWR, n), make([]verbs.SGE, n)
	if _, err := p.refill(); err != nil {
		return p, err
	}
	// The limit event says the SRQ runs low: the rank is not progressing
	// while peers send (credits overcommitted, see New).
	if err := p.arm(); err != nil {
		return p, err
	}
	return p, nil
}

func (p *recvPool) limit() int { return p.n / 4 }

// arm arms the SRQ's limit event.
func (p *recvPool) arm() error {
	if err := p.srq.Modify(verbs.SRQAttr{SRQLimit: uint32(p.limit())}, verbs.SRQLimit); err != nil {
		return fmt.Errorf("rc: arm SRQ limit: %w", err)
	}
	return nil
}

func (p *recvPool) buf(i uint32) []byte { return p.mem[int(i)*p.size : int(i+1)*p.size] }

// put frees buffer i after its frame was delivered.
func (p *recvPool) put(i uint32) {
	p.mu.Lock()
	p.free = append(p.free, i)
	p.posted--
	p.mu.Unlock()
}

// refill posts every free buffer and returns how many are posted.
func (p *recvPool) refill() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 {
		return p.posted, nil
	}
	k := len(p.free)
	for j, i := range p.free {
		p.sges[j] = p.mr.SGE(int(i)*p.size, p.size)
		p.wrs[j] = verbs.RecvWR{WRID: wrRecv | uint64(i), SG: p.sges[j : j+1]}
		if j > 0 {
			p.wrs[j-1].Next = &p.wrs[j]
		}
	}
	err := p.srq.PostRecv(&p.wrs[0])
	posted := k
	var pe *verbs.PostError
	if errors.As(err, &pe) {
		posted = pe.Index
	}
	p.free = append(p.free[:0], p.free[posted:]...)
	p.posted += posted
	clear(p.wrs[:k])
	if err != nil {
		return p.posted, fmt.Errorf("rc: post receive buffers: %w", err)
	}
	return p.posted, nil
}

func (p *recvPool) close() error {
	var errs []error
	if p.srq != nil {
		errs = append(errs, p.srq.Close())
	}
	if p.mr != nil {
		errs = append(errs, p.mr.Close())
	}
	if p.mem != nil {
		errs = append(errs, verbs.Free(p.mem))
	}
	return errors.Join(errs...)
}

// sendPool holds registered buffers that frames too large to go inline
// are copied into. A slot belongs to the device from PostSend until its
// completion is polled. Owned by the goroutine calling the transport.
type sendPool struct {
	mem  []byte
	mr   *verbs.MR
	size int
	free []uint32
}

func newSendPool(pd *verbs.PD, n, size int) (*sendPool, error) {
	p := &sendPool{size: size}
	var err error
	if p.mem, err = verbs.Alloc(n * size); err != nil {
		return p, fmt.Errorf("rc: send buffers: %w", err)
	}
	if p.mr, err = pd.RegMR(p.mem, verbs.AccessLocalWrite); err != nil {
		return p, fmt.Errorf("rc: send buffers: %w", err)
	}
	for i := n - 1; i >= 0; i-- {
		p.free = append(p.free, uint32(i))
	}
	return p, nil
}

func (p *sendPool) get() (uint32, bool) {
	if len(p.free) == 0 {
		return 0, false
	}
	i := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return i, true
}

func (p *sendPool) put(i uint32) { p.free = append(p.free, i) }

func (p *sendPool) buf(i uint32) []byte { return p.mem[int(i)*p.size : int(i+1)*p.size] }

func (p *sendPool) close() error {
	var errs []error
	if p.mr != nil {
		errs = append(errs, p.mr.Close())
	}
	if p.mem != nil {
		errs = append(errs, verbs.Free(p.mem))
	}
	return errors.Join(errs...)
}
