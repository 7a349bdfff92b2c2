package rc

import "github.com/xrcrun/xrc/transport"

// remoteMagic marks the Remotes of rc (verbsx.Remote).
const remoteMagic = 'R'

// Expose registers buf for remote reads (through the registration cache)
// and describes it: this rank, its address, rkey and length. The caller
// keeps buf alive and unmoved until Unexpose.
func (t *Transport) Expose(buf []byte) (transport.Remote, error) { return t.e.Expose(buf) }

// Unexpose ends an Expose: the registration may be dropped (or kept in
// the cache).
func (t *Transport) Unexpose(rm transport.Remote) error { return t.e.Unexpose(rm) }

// Read pulls len(dst) bytes of the memory src describes, which rank
// exposed, into dst with RDMA READs over this rank's QP toward rank, in
// chunks of verbsx.ChunkSize, as many at once as the QP and
// verbsx.MaxInFlight allow. dst is registered (through the cache) until
// the last chunk completes; the handler of a later Progress gets
// ReadDone(cookie). A Remote not made by rc at rank, or shorter than dst,
// is refused with ErrBadRemote.
func (t *Transport) Read(rank int, dst []byte, src transport.Remote, cookie uint64) error {
	return t.e.Read(rank, dst, src, cookie)
}
