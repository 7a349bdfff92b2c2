package rc

import (
	"fmt"

	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/transport/internal/verbsx"
)

// remoteMagic marks the Remotes of rc (verbsx.Remote).
const remoteMagic = 'R'

// Expose registers buf for remote reads (through the registration cache)
// and describes it: this rank, its address, rkey and length. The caller
// keeps buf alive and unmoved until Unexpose.
func (t *Transport) Expose(buf []byte) (transport.Remote, error) {
	rm, err := verbsx.Expose(t.core.Cache, t.cfg.Rank, remoteMagic, buf)
	if err != nil {
		return nil, fmt.Errorf("rc: %w", err)
	}
	t.m.Exposed.Inc()
	return rm, nil
}

// Unexpose ends an Expose: the registration may be dropped (or kept in
// the cache).
func (t *Transport) Unexpose(rm transport.Remote) error {
	return verbsx.Unexpose(t.core.Cache, t.cfg.Rank, remoteMagic, rm)
}

// Read pulls len(dst) bytes of the memory src describes, which rank
// exposed, into dst with RDMA READs over this rank's QP toward rank, in
// chunks of verbsx.ChunkSize, as many at once as the QP and verbsx.MaxInFlight allow. dst is
// registered (through the cache) until the last chunk completes; the
// handler of a later Progress gets ReadDone(cookie). A Remote not made by
// rc at rank, or shorter than dst, is refused with ErrBadRemote.
func (t *Transport) Read(rank int, dst []byte, src transport.Remote, cookie uint64) error {
	p, err := t.peer(rank)
	if err != nil {
		return err
	}
	r, ok := verbsx.ParseRemote(src, remoteMagic)
	if !ok || r.Rank != rank || uint64(len(dst)) > r.Len {
		t.m.Bad.Inc()
		return fmt.Errorf("%w: %d bytes from rank %d", transport.ErrBadRemote, len(dst), rank)
	}
	if p.state == peerFailed {
		return p.err
	}
	if p.pending, err = t.core.Reads.Start(dst, r.Addr, r.RKey, cookie, p.pending); err != nil {
		return fmt.Errorf("rc: %w", err)
	}
	if len(dst) == 0 {
		return nil
	}
	t.m.Reads.Inc()
	t.m.ReadBytes.Add(float64(len(dst)))
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
	for len(p.pending) > 0 && p.readsOut < t.core.MaxRd && p.sqUsed < t.cfg.SendDepth-1 && t.core.Reads.Room() {
		c := p.pending[0]
		wr := c.WR(wrRead | c.Op.ID)
		if err := p.qp.PostSend(&wr); err != nil {
			t.fail(p, peerError(p, "read: %w", err))
			return
		}
		p.pending[0] = verbsx.Chunk{}
		p.pending = p.pending[1:]
		p.sqUsed++
		p.readsOut++
		t.core.Reads.Posted()
	}
}
