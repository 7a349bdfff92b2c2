package verbsx

import (
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/verbs"
)

// ChunkSize is the most bytes one RDMA READ of a Read moves.
const ChunkSize = 256 << 10

// MaxInFlight is how many READ chunks a transport has outstanding at
// once, over all its QPs: the responses of every READ posted come back to
// this rank's device at once, and a device's receive buffers (a soft
// HCA's socket buffer, a NIC's) hold only so much before they drop what
// comes, which the READs must then ask for again. A megabyte in flight
// keeps a loopback link busy.
const MaxInFlight = 4

// ReadOp is one Read: its chunks, the registration of its destination,
// and the first error of its chunks.
type ReadOp struct {
	ID     uint64
	cookie uint64
	entry  *RegEntry
	left   int
	err    error
}

// Chunk is one RDMA READ of a ReadOp, waiting to be posted.
type Chunk struct {
	Op    *ReadOp
	local uint64
	lkey  uint32
	raddr uint64
	rkey  uint32
	n     uint32
	srqn  uint32 // the SRQ the READ names (XRC); 0 for RC
}

// WR is the chunk's RDMA READ, signaled, with WR id wrid. The WR's
// memory (dst) belongs to the device until its completion is polled.
func (c Chunk) WR(wrid uint64) verbs.SendWR {
	return verbs.SendWR{WRID: wrid, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{{Addr: c.local, Length: c.n, LKey: c.lkey}}, RemoteAddr: c.raddr, RKey: c.rkey,
		RemoteSRQNum: c.srqn}
}

// Reads tracks the Reads of a transport: it registers their destinations
// through the cache, splits them into chunks, counts their completions and
// queues the finished ones for the handler. Owned by the goroutine
// driving the transport.
type Reads struct {
	cache    *RegCache
	ops      map[uint64]*ReadOp
	next     uint64
	done     []readDone
	inFlight int // chunks posted and not completed, over all QPs
}

// Room reports whether another chunk may be posted now: fewer than
// MaxInFlight are.
func (r *Reads) Room() bool { return r.inFlight < MaxInFlight }

// Posted counts a chunk the transport posted.
func (r *Reads) Posted() { r.inFlight++ }

// Completed counts the completion of the posted chunk whose Read has id
// (with err if it failed) and finishes the Read after its last chunk. It
// reports false if no Read has that id.
func (r *Reads) Completed(id uint64, err error) bool {
	r.inFlight--
	op := r.ops[id]
	if op == nil {
		return false
	}
	r.ChunkDone(op, err)
	return true
}

type readDone struct {
	cookie uint64
	err    error
}

// NewReads makes an empty tracker registering through cache.
func NewReads(cache *RegCache) *Reads { return &Reads{cache: cache, ops: map[uint64]*ReadOp{}} }

// Start starts a Read of len(dst) bytes from the remote memory at raddr
// (rkey) into dst, and appends its chunks to queue; their READs name the
// XRC SRQ srqn (0 for RC), whose PD the remote device checks rkey
// against. dst must stay alive until the Read finishes; an empty dst
// finishes at once.
func (r *Reads) Start(dst []byte, raddr uint64, rkey, srqn uint32, cookie uint64, queue []Chunk) ([]Chunk, error) {
	if len(dst) == 0 {
		r.done = append(r.done, readDone{cookie: cookie})
		return queue, nil
	}
	e, err := r.cache.Get(dst)
	if err != nil {
		return queue, err
	}
	r.next++
	op := &ReadOp{ID: r.next, cookie: cookie, entry: e}
	r.ops[op.ID] = op
	base := uint64(unix.AddrOf(dst))
	for off := 0; off < len(dst); off += ChunkSize {
		n := min(ChunkSize, len(dst)-off)
		queue = append(queue, Chunk{Op: op, local: base + uint64(off), lkey: e.MR.LKey(),
			raddr: raddr + uint64(off), rkey: rkey, n: uint32(n), srqn: srqn})
		op.left++
	}
	return queue, nil
}

// ChunkDone counts a chunk of op as done (with err if it failed); the
// last one finishes op.
func (r *Reads) ChunkDone(op *ReadOp, err error) {
	if op.err == nil {
		op.err = err
	}
	op.left--
	if op.left > 0 {
		return
	}
	delete(r.ops, op.ID)
	if perr := r.cache.Put(op.entry); op.err == nil {
		op.err = perr
	}
	r.done = append(r.done, readDone{op.cookie, op.err})
}

// Fail ends the chunks of queue with err (their QP failed).
func (r *Reads) Fail(queue []Chunk, err error) {
	for _, c := range queue {
		r.ChunkDone(c.Op, err)
	}
}

// Finish reports the finished Reads to h and returns how many.
func (r *Reads) Finish(h transport.Handler) int {
	n := 0
	for len(r.done) > 0 {
		done := r.done
		r.done = nil
		for _, d := range done {
			h.ReadDone(d.cookie, d.err)
			n++
		}
	}
	return n
}
