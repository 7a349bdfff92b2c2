package rc

import (
	"fmt"

	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/verbs"
)

// Expose registers buf for remote reads (through the registration cache)
// and describes it: this rank, its address, rkey and length. The caller
// keeps buf alive and unmoved until Unexpose.
func (t *Transport) Expose(buf []byte) (transport.Remote, error) {
	r := remote{rank: t.cfg.Rank}
	if len(buf) > 0 {
		e, err := t.cache.get(buf)
		if err != nil {
			return nil, err
		}
		r.addr, r.rkey, r.len = uint64(unix.AddrOf(buf)), e.mr.RKey(), uint64(len(buf))
	}
	t.m.exposed.Inc()
	return r.encode(), nil
}

// Unexpose ends an Expose: the registration may be dropped (or kept in
// the cache).
func (t *Transport) Unexpose(rm transport.Remote) error {
	r, ok := parseRemote(rm)
	if !ok || r.rank != t.cfg.Rank {
		return fmt.Errorf("%w: unexpose a remote this rank did not make", transport.ErrBadRemote)
	}
	if r.len == 0 {
		return nil
	}
	e := t.cache.find(uintptr(r.addr), int(r.len), r.rkey)
	if e == nil {
		return fmt.Errorf("%w: unexpose %d bytes at %#x: not exposed", transport.ErrBadRemote, r.len, r.addr)
	}
	return t.cache.put(e)
}

// readOp is one Read: its chunks, the registration of its destination,
// and the first error of its chunks.
type readOp struct {
	id     uint64
	cookie uint64
	entry  *regEntry
	left   int
	err    error
}

// readChunk is one RDMA READ of a readOp.
type readChunk struct {
	op    *readOp
	local uint64
	lkey  uint32
	raddr uint64
	rkey  uint32
	n     uint32
}

// Read pulls len(dst) bytes of the memory src describes, which rank
// exposed, into dst with RDMA READs over this rank's QP toward rank, in
// chunks of at most 1 MiB, as many at once as the QP allows. dst is
// registered (through the cache) until the last chunk completes; the
// handler of a later Progress gets ReadDone(cookie). A Remote not made by
// rc at rank, or shorter than dst, is refused with ErrBadRemote.
func (t *Transport) Read(rank int, dst []byte, src transport.Remote, cookie uint64) error {
	p, err := t.peer(rank)
	if err != nil {
		return err
	}
	r, ok := parseRemote(src)
	if !ok || r.rank != rank || uint64(len(dst)) > r.len {
		t.m.bad.Inc()
		return fmt.Errorf("%w: %d bytes from rank %d", transport.ErrBadRemote, len(dst), rank)
	}
	if p.state == peerFailed {
		return p.err
	}
	if len(dst) == 0 {
		t.done = append(t.done, readDone{cookie: cookie})
		return nil
	}
	e, err := t.cache.get(dst)
	if err != nil {
		return err
	}
	t.nextRead++
	op := &readOp{id: t.nextRead, cookie: cookie, entry: e}
	t.reads[op.id] = op
	base := uint64(unix.AddrOf(dst))
	for off := 0; off < len(dst); off += readChunkSize {
		n := min(readChunkSize, len(dst)-off)
		p.pending = append(p.pending, readChunk{op: op, local: base + uint64(off), lkey: e.mr.LKey(),
			raddr: r.addr + uint64(off), rkey: r.rkey, n: uint32(n)})
		op.left++
	}
	t.m.reads.Inc()
	t.m.readBytes.Add(float64(len(dst)))
	if _, err := t.ready(p); err != nil {
		t.fail(p, err)
		return nil
	}
	t.postReads(p)
	if len(p.pending) > 0 {
		t.markDirty(p)
	}
	return nil
}

// postReads posts p's waiting reads while its QP has room for them.
func (t *Transport) postReads(p *peer) {
	if p.state != peerReady {
		return
	}
	for len(p.pending) > 0 && p.readsOut < t.maxRd && p.sqUsed < t.cfg.SendDepth-1 {
		c := p.pending[0]
		wr := verbs.SendWR{WRID: wrRead | c.op.id, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{{Addr: c.local, Length: c.n, LKey: c.lkey}}, RemoteAddr: c.raddr, RKey: c.rkey}
		if err := p.qp.PostSend(&wr); err != nil {
			t.fail(p, peerError(p, "read: %w", err))
			return
		}
		p.pending[0] = readChunk{}
		p.pending = p.pending[1:]
		p.sqUsed++
		p.readsOut++
	}
}

// chunkDone counts a chunk of op as done; the last one finishes op.
func (t *Transport) chunkDone(op *readOp, err error) {
	if op.err == nil {
		op.err = err
	}
	op.left--
	if op.left > 0 {
		return
	}
	delete(t.reads, op.id)
	if perr := t.cache.put(op.entry); op.err == nil {
		op.err = perr
	}
	t.done = append(t.done, readDone{op.cookie, op.err})
}
