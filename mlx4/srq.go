//go:build linux

package mlx4

import (
	"fmt"
	"math/bits"
	"sync"

	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
	"github.com/xrcrun/xrc/verbs"
)

// SRQ is a shared receive queue: a ring of WQEs linked into a free list by
// their next segments. The device consumes posted WQEs in list order; the
// provider appends a WQE back to the list when its completion is polled.
type SRQ struct {
	ctx    *Context
	handle uint32
	srqn   uint32
	ring          // the WQEs, and the doorbell record: 16-bit counter of posted WQEs
	shift  uint   // log2 of the WQE size
	max    uint32 // WQEs in the ring, a power of two
	maxGS  int
	cq     *CQ // an XRC SRQ's CQ, where its completions land; nil for others

	mu      sync.Mutex // guards the list and counter
	head    uint32     // guarded by mu: next free WQE to post into
	tail    uint32     // guarded by mu: last free WQE
	counter uint16     // guarded by mu: WQEs posted, ever
	wrid    []uint64   // guarded by mu
	dead    bool       // guarded by mu: destroyed, the ring freed
}

// CreateSRQ allocates the SRQ ring and issues CREATE_SRQ.
func (pd *PD) CreateSRQ(attr verbs.SRQInit) (verbs.ProviderSRQ, error) {
	c := pd.ctx
	s, err := c.newSRQ(attr.Attr)
	if err != nil {
		return nil, err
	}
	req := mlx4abi.CreateSRQ{
		Core: uverbs.CreateSRQ{UserHandle: attr.Handle, PDHandle: pd.handle,
			MaxWR: attr.Attr.MaxWR, MaxSGE: attr.Attr.MaxSGE, SRQLimit: attr.Attr.SRQLimit},
		Drv: mlx4abi.IBCreateSRQ{BufAddr: addr(s.buf), DBAddr: addr(s.db)},
	}
	var r mlx4abi.CreateSRQResp
	if err := uverbs.Exec(c.conn, uverbs.CmdCreateSRQ, &req, &r); err != nil {
		c.freeRing(s.ring)
		return nil, err
	}
	s.handle, s.srqn = r.Core.SRQHandle, r.Drv.SRQN
	return s, nil
}

// newSRQ checks the size of an SRQ against the device's limits, and lays
// out and allocates its ring, every WQE linked into the free list.
func (c *Context) newSRQ(attr verbs.SRQAttr) (*SRQ, error) {
	dev, err := c.deviceAttr()
	if err != nil {
		return nil, err
	}
	if attr.MaxWR > dev.MaxSRQWR || attr.MaxSGE > dev.MaxSRQSGE {
		return nil, unix.Errorf(unix.EINVAL, "srq of %d WRs with %d SGEs exceeds the device's %d and %d",
			attr.MaxWR, attr.MaxSGE, dev.MaxSRQWR, dev.MaxSRQSGE)
	}
	s := &SRQ{ctx: c, maxGS: int(attr.MaxSGE)}
	s.max = uint32(1) << bits.Len32(attr.MaxWR) // roundup_pow_of_two(max_wr + 1)
	size := mlx4hw.SRQNextSegSize + s.maxGS*mlx4hw.DataSegSize
	for s.shift = 5; 1<<s.shift < size; s.shift++ {
	}
	if s.ring, err = c.allocRing(int(s.max)<<s.shift, true); err != nil {
		return nil, err
	}
	// Link every WQE into the free list and terminate every scatter list.
	for i := uint32(0); i < s.max; i++ {
		w := s.wqe(i)
		mlx4hw.PutSRQNext(w, uint16((i+1)&(s.max-1)))
		mlx4hw.PutRecvSG(w[mlx4hw.SRQNextSegSize:], nil, 1)
	}
	s.head, s.tail = 0, s.max-1
	s.wrid = make([]uint64, s.max)
	return s, nil
}

func (s *SRQ) wqe(i uint32) []byte {
	off := int(i) << s.shift
	return s.buf[off : off+1<<s.shift]
}

// Num is the SRQ number.
func (s *SRQ) Num() uint32 { return s.srqn }

// PostRecv writes receive WQEs into free list entries and publishes the new
// counter in the doorbell record.
func (s *SRQ) PostRecv(wr *verbs.RecvWR) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return &verbs.PostError{Index: 0, Err: fmt.Errorf("mlx4: post receive: %w", verbs.ErrClosed)}
	}
	var err error
	n := 0
	for ; wr != nil; wr, n = wr.Next, n+1 {
		if len(wr.SG) > s.maxGS {
			err = &verbs.PostError{Index: n, Err: unix.Errorf(unix.EINVAL, "%d SGEs, SRQ takes %d", len(wr.SG), s.maxGS)}
			break
		}
		if e := checkSGLengths(wr.SG); e != nil {
			err = &verbs.PostError{Index: n, Err: e}
			break
		}
		if s.head == s.tail {
			err = &verbs.PostError{Index: n, Err: unix.Error(unix.ENOMEM, "srq full")}
			break
		}
		w := s.wqe(s.head)
		s.wrid[s.head] = wr.WRID
		next := uint32(mlx4hw.SRQNext(w))
		putRecvSG(w[mlx4hw.SRQNextSegSize:], wr.SG, s.maxGS)
		s.head = next
	}
	if n > 0 {
		s.counter += uint16(n)
		mlx4hw.StoreBE32(s.db, uint32(s.counter))
	}
	return err
}

// checkSGLengths refuses an SGE of 2 GiB or more: a data segment's byte
// count has 31 bits, and 0x80000000 means an empty entry.
func checkSGLengths(sg []verbs.SGE) error {
	for i := range sg {
		if sg[i].Length >= mlx4hw.InlineFlag {
			return unix.Errorf(unix.EINVAL, "SGE %d of %d bytes: a data segment takes less than 2 GiB", i, sg[i].Length)
		}
	}
	return nil
}

// putRecvSG writes a receive scatter list from verbs SGEs.
func putRecvSG(b []byte, sg []verbs.SGE, maxGS int) {
	var i int
	for i = range sg {
		mlx4hw.PutDataSeg(b[i*mlx4hw.DataSegSize:], sg[i].Length, sg[i].LKey, sg[i].Addr)
	}
	if len(sg) < maxGS {
		mlx4hw.PutRecvSG(b[len(sg)*mlx4hw.DataSegSize:], nil, 1)
	}
}

// retire returns the wr_id of the WQE at index and puts the WQE back on the
// free list.
func (s *SRQ) retire(index uint16) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return 0
	}
	i := uint32(index) & (s.max - 1)
	id := s.wrid[i]
	mlx4hw.PutSRQNext(s.wqe(s.tail), uint16(i))
	s.tail = i
	return id
}

// Modify issues MODIFY_SRQ.
func (s *SRQ) Modify(attr verbs.SRQAttr, mask verbs.SRQAttrMask) error {
	req := uverbs.Cmd[uverbs.ModifySRQ]{Core: uverbs.ModifySRQ{
		SRQHandle: s.handle, AttrMask: uint32(mask), MaxWR: attr.MaxWR, SRQLimit: attr.SRQLimit,
	}}
	return uverbs.ExecNoResp(s.ctx.conn, uverbs.CmdModifySRQ, &req)
}

// Query issues QUERY_SRQ.
func (s *SRQ) Query() (verbs.SRQAttr, error) {
	req := uverbs.Cmd[uverbs.QuerySRQ]{Core: uverbs.QuerySRQ{SRQHandle: s.handle}}
	var r uverbs.QuerySRQResp
	if err := uverbs.Exec(s.ctx.conn, uverbs.CmdQuerySRQ, &req, &r); err != nil {
		return verbs.SRQAttr{}, err
	}
	return verbs.SRQAttr{MaxWR: r.MaxWR, MaxSGE: r.MaxSGE, SRQLimit: r.SRQLimit}, nil
}

// Destroy issues DESTROY_SRQ and frees the ring. An XRC SRQ first takes
// its unpolled completions off its CQ and leaves the table CQ polling finds
// it in, as libmlx4 does, and goes back in if the device refuses.
func (s *SRQ) Destroy() error {
	if s.cq != nil {
		s.cq.cleanXSRQ(s)
		s.ctx.xsrqs.forget(s.srqn)
	}
	req := uverbs.Cmd[uverbs.DestroySRQ]{Core: uverbs.DestroySRQ{SRQHandle: s.handle}}
	var r uverbs.DestroySRQResp
	if err := destroyed(uverbs.Exec(s.ctx.conn, uverbs.CmdDestroySRQ, &req, &r)); err != nil {
		if s.cq != nil {
			s.ctx.xsrqs.put(s.srqn, s)
		}
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead = true
	return s.ctx.freeRing(s.ring)
}
