package verbsx

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/xrcrun/xrc/verbs"
)

// RecvPool is an SRQ and its receive buffers: N buffers of Size bytes in
// one registered mapping. A buffer belongs to the device while posted, to
// Progress from its completion until its frame is delivered, then it is
// free until posted again. mu guards the free list and the SRQ's posting,
// which both Progress and the SRQ limit event do.
type RecvPool struct {
	SRQ  *verbs.SRQ
	Mem  []byte
	MR   *verbs.MR
	Size int
	N    int
	wrid uint64 // ORed into the index in each receive's WR id

	mu     sync.Mutex
	free   []uint32 // guarded by mu: buffers not posted
	posted int      // guarded by mu
	wrs    []verbs.RecvWR
	sges   []verbs.SGE
	// fired says the limit event came and the limit is not armed.
	fired atomic.Bool
}

// NewRecvPool takes srq (an SRQ of pd, made by the caller: the pool owns
// it from now on, also on error), allocates n buffers of size bytes,
// posts them with WR ids wrid|index, and arms the SRQ limit at a quarter.
// On error the returned pool is to be closed.
func NewRecvPool(pd *verbs.PD, srq *verbs.SRQ, n, size int, wrid uint64) (*RecvPool, error) {
	p := &RecvPool{SRQ: srq, Size: size, N: n, wrid: wrid}
	var err error
	if p.Mem, err = verbs.Alloc(n * size); err != nil {
		return p, fmt.Errorf("receive buffers: %w", err)
	}
	if p.MR, err = pd.RegMR(p.Mem, verbs.AccessLocalWrite); err != nil {
		return p, fmt.Errorf("receive buffers: %w", err)
	}
	for i := range n {
		p.free = append(p.free, uint32(i))
	}
	p.wrs, p.sges = make([]verbs.RecvWR, n), make([]verbs.SGE, n)
	if _, err := p.Refill(); err != nil {
		return p, err
	}
	// The limit event says the SRQ runs low: the rank is not progressing
	// while peers send (credits overcommitted).
	return p, p.arm()
}

// Limit is the number of posted buffers below which the SRQ limit event
// fires.
func (p *RecvPool) Limit() int { return p.N / 4 }

func (p *RecvPool) arm() error {
	if err := p.SRQ.Modify(verbs.SRQAttr{SRQLimit: uint32(p.Limit())}, verbs.SRQLimit); err != nil {
		return fmt.Errorf("arm SRQ limit: %w", err)
	}
	return nil
}

// OnLimit handles the SRQ limit event (from the async event goroutine):
// it posts the free buffers at once. The limit is armed again by Rearm
// once the SRQ is above it: armed below, it would fire again and again
// while the rank does not progress.
func (p *RecvPool) OnLimit() error {
	_, err := p.Refill()
	p.fired.Store(true)
	return err
}

// Rearm arms the limit again if it fired and posted (from Refill) is
// above it. Called by Progress.
func (p *RecvPool) Rearm(posted int) error {
	if posted > p.Limit() && p.fired.Swap(false) {
		return p.arm()
	}
	return nil
}

// Buf is receive buffer i.
func (p *RecvPool) Buf(i uint32) []byte { return p.Mem[int(i)*p.Size : int(i+1)*p.Size] }

// Put frees buffer i after its frame was delivered (or dropped).
func (p *RecvPool) Put(i uint32) {
	p.mu.Lock()
	p.free = append(p.free, i)
	p.posted--
	p.mu.Unlock()
}

// Refill posts every free buffer and returns how many are posted.
func (p *RecvPool) Refill() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 {
		return p.posted, nil
	}
	k := len(p.free)
	for j, i := range p.free {
		p.sges[j] = p.MR.SGE(int(i)*p.Size, p.Size)
		p.wrs[j] = verbs.RecvWR{WRID: p.wrid | uint64(i), SG: p.sges[j : j+1]}
		if j > 0 {
			p.wrs[j-1].Next = &p.wrs[j]
		}
	}
	err := p.SRQ.PostRecv(&p.wrs[0])
	posted := k
	var pe *verbs.PostError
	if errors.As(err, &pe) {
		posted = pe.Index
	}
	p.free = append(p.free[:0], p.free[posted:]...)
	p.posted += posted
	clear(p.wrs[:k])
	if err != nil {
		return p.posted, fmt.Errorf("post receive buffers: %w", err)
	}
	return p.posted, nil
}

// Close destroys the SRQ and frees the buffers.
func (p *RecvPool) Close() error {
	var errs []error
	if p.SRQ != nil {
		errs = append(errs, p.SRQ.Close())
	}
	if p.MR != nil {
		errs = append(errs, p.MR.Close())
	}
	if p.Mem != nil {
		errs = append(errs, verbs.Free(p.Mem))
	}
	return errors.Join(errs...)
}

// SendPool holds registered buffers that frames too large to go inline
// are copied into. A slot belongs to the device from PostSend until its
// completion is polled. Owned by the goroutine calling the transport.
type SendPool struct {
	Mem  []byte
	MR   *verbs.MR
	Size int
	free []uint32
}

// NewSendPool allocates and registers n send buffers of size bytes. On
// error the returned pool is to be closed.
func NewSendPool(pd *verbs.PD, n, size int) (*SendPool, error) {
	p := &SendPool{Size: size}
	var err error
	if p.Mem, err = verbs.Alloc(n * size); err != nil {
		return p, fmt.Errorf("send buffers: %w", err)
	}
	if p.MR, err = pd.RegMR(p.Mem, verbs.AccessLocalWrite); err != nil {
		return p, fmt.Errorf("send buffers: %w", err)
	}
	for i := n - 1; i >= 0; i-- {
		p.free = append(p.free, uint32(i))
	}
	return p, nil
}

// Get takes a free slot.
func (p *SendPool) Get() (uint32, bool) {
	if len(p.free) == 0 {
		return 0, false
	}
	i := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return i, true
}

// Put frees slot i once its send completed.
func (p *SendPool) Put(i uint32) { p.free = append(p.free, i) }

// Buf is slot i's buffer.
func (p *SendPool) Buf(i uint32) []byte { return p.Mem[int(i)*p.Size : int(i+1)*p.Size] }

// SGE describes the first n bytes of slot i.
func (p *SendPool) SGE(i uint32, n int) verbs.SGE { return p.MR.SGE(int(i)*p.Size, n) }

// Close deregisters and frees the buffers.
func (p *SendPool) Close() error {
	var errs []error
	if p.MR != nil {
		errs = append(errs, p.MR.Close())
	}
	if p.Mem != nil {
		errs = append(errs, verbs.Free(p.Mem))
	}
	return errors.Join(errs...)
}
