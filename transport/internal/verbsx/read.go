package verbsx

import (
	"fmt"

	"github.com/xrcrun/xrc/transport"
)

// Read pulls len(dst) bytes of the memory src describes, which rank
// exposed, into dst with RDMA READs over rank's Conn, naming its SRQ
// (XRC), in chunks of ChunkSize, as many at once as the QP and
// MaxInFlight allow. dst is registered (through the cache) until the last
// chunk completes; the handler of a later Progress gets ReadDone(cookie).
// A Remote not made by this transport at rank, or shorter than dst, is
// refused with ErrBadRemote.
func (e *Endpoint) Read(rank int, dst []byte, src transport.Remote, cookie uint64) error {
	if e.stopped {
		return e.errClosed("read")
	}
	p, err := e.Peer(rank)
	if err != nil {
		return err
	}
	r, ok := ParseRemote(src, e.magic)
	if !ok || r.Rank != rank || uint64(len(dst)) > r.Len {
		e.m.Bad.Inc()
		return fmt.Errorf("%w: %d bytes from rank %d", transport.ErrBadRemote, len(dst), rank)
	}
	if p.err != nil { // its Conn's, if that failed (Fail)
		return p.err
	}
	c := p.Conn
	if c.pending, err = e.Core.Reads.Start(dst, r.Addr, r.RKey, p.SRQN, cookie, c.pending); err != nil {
		return fmt.Errorf("%s: %w", e.name, err)
	}
	if len(dst) == 0 {
		return nil
	}
	e.m.Reads.Inc()
	e.m.ReadBytes.Add(float64(len(dst)))
	if c.state != ConnReady {
		// A read needs only the QP: the exposing rank gets no
		// completion, so (XRC) it need not know this rank's TGT QP yet.
		if err := e.connect(p); err != nil {
			e.Fail(c, err) // the read fails with c
			return nil
		}
	}
	e.postReads(c)
	e.MarkDirty(c)
	return nil
}

// postReads posts c's waiting reads while its QP has room for them.
func (e *Endpoint) postReads(c *Conn) {
	if !c.up() {
		return
	}
	for len(c.pending) > 0 && c.readsOut < e.Core.MaxRd && c.sqUsed < e.sendDepth-1 && e.Core.Reads.Room() {
		ch := c.pending[0]
		wr := ch.WR(WRRead | ch.Op.ID)
		if err := c.QP.PostSend(&wr); err != nil {
			e.Fail(c, c.Errorf("read: %w", err))
			return
		}
		c.pending[0] = Chunk{}
		c.pending = c.pending[1:]
		c.sqUsed++
		c.readsOut++
		e.Core.Reads.Posted()
	}
}
