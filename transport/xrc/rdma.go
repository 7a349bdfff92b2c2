package xrc

import "github.com/xrcrun/xrc/transport"

// remoteMagic marks the Remotes of xrc (verbsx.Remote).
const remoteMagic = 'X'

// Expose registers buf for remote reads (through the registration cache,
// in the PD of this rank's XRC SRQ, which the reads name) and describes
// it: this rank, its address, rkey and length. The caller keeps buf alive
// and unmoved until Unexpose.
func (t *Transport) Expose(buf []byte) (transport.Remote, error) { return t.e.Expose(buf) }

// Unexpose ends an Expose: the registration may be dropped (or kept in
// the cache).
func (t *Transport) Unexpose(rm transport.Remote) error { return t.e.Unexpose(rm) }

// Read pulls len(dst) bytes of the memory src describes, which rank
// exposed, into dst with RDMA READs over this rank's INI QP toward rank's
// node, each naming rank's SRQ, in chunks of verbsx.ChunkSize, as many at
// once as the QP and verbsx.MaxInFlight allow. A read needs only the INI
// QP: with lazy connection it waits for the INI QP at RTS, not for rank's
// reply. Without lazy connection, a read toward a node whose INI QP is
// not connected fails the node: the read ends (ReadDone) with an error
// naming the node, which every later call toward any of its ranks
// returns. dst is registered (through the cache) until the last chunk
// completes; the handler of a later Progress gets ReadDone(cookie). A
// Remote not made by xrc at rank, or shorter than dst, is refused with
// ErrBadRemote.
func (t *Transport) Read(rank int, dst []byte, src transport.Remote, cookie uint64) error {
	return t.e.Read(rank, dst, src, cookie)
}
