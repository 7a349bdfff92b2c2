package xrc

import (
	"fmt"

	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/transport/internal/verbsx"
)

// remoteMagic marks the Remotes of xrc (verbsx.Remote).
const remoteMagic = 'X'

// Expose registers buf for remote reads (through the registration cache,
// in the PD of this rank's XRC SRQ, which the reads name) and describes
// it: this rank, its address, rkey and length. The caller keeps buf alive
// and unmoved until Unexpose.
func (t *Transport) Expose(buf []byte) (transport.Remote, error) {
	rm, err := verbsx.Expose(t.core.Cache, t.cfg.Rank, remoteMagic, buf)
	if err != nil {
		return nil, fmt.Errorf("xrc: %w", err)
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
// exposed, into dst with RDMA READs over this rank's INI QP toward rank's
// node, each naming rank's SRQ, in chunks of verbsx.ChunkSize, as many at
// once as the QP allows. dst is registered (through the cache) until the
// last chunk completes; the handler of a later Progress gets
// ReadDone(cookie). A Remote not made by xrc at rank, or shorter than
// dst, is refused with ErrBadRemote.
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
	n := p.node
	if n.state == connFailed {
		return n.err
	}
	var chunks [1]verbsx.Chunk
	queue, err := t.core.Reads.Start(dst, r.Addr, r.RKey, cookie, chunks[:0])
	if err != nil {
		return fmt.Errorf("xrc: %w", err)
	}
	if len(dst) == 0 {
		return nil
	}
	for _, c := range queue {
		n.pending = append(n.pending, pendingRead{Chunk: c, srqn: p.srqn})
	}
	t.m.Reads.Inc()
	t.m.ReadBytes.Add(float64(len(dst)))
	if n.state != connReady && t.lz != nil {
		// A read needs only the INI QP: the exposing rank gets no
		// completion, so it need not know this rank's TGT QP yet.
		if err := t.lz.start(p); err != nil {
			return nil // the node failed, and the read with it
		}
	}
	t.postReads(n)
	if len(n.pending) > 0 {
		t.markDirty(n)
	}
	return nil
}

// postReads posts n's waiting reads while its INI QP has room for them.
func (t *Transport) postReads(n *node) {
	if n.state != connReady {
		return
	}
	for len(n.pending) > 0 && n.readsOut < t.core.MaxRd && n.sqUsed < t.cfg.SendDepth-1 && t.core.Reads.Room() {
		c := n.pending[0]
		wr := c.WR(wrRead | c.Op.ID)
		wr.RemoteSRQNum = c.srqn
		if err := n.ini.PostSend(&wr); err != nil {
			t.fail(n, nodeError(n, "read: %w", err))
			return
		}
		n.pending[0] = pendingRead{}
		n.pending = n.pending[1:]
		n.sqUsed++
		n.readsOut++
		t.core.Reads.Posted()
	}
}
