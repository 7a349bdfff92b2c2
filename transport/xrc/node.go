package xrc

import "github.com/xrcrun/xrc/transport/internal/verbsx"

// node is a remote node as this rank sees it: its ranks and this rank's
// INI QP toward it (ini), whose send queue is shared by the sends and
// reads toward all of them. Owned by the goroutine driving the transport.
type node struct {
	id    int
	peers []*peer // the node's ranks
	ini   verbsx.Conn
	tgt   uint32 // the TGT QP on the node that the INI QP is connected to
}

// peer is a remote rank: its record, its SRQ number and the credits of
// the frames both ways (verbsx.Peer, whose Conn is its node's INI QP),
// and, with lazy connection, how far the handshake with it is. Owned by
// the goroutine driving the transport.
type peer struct {
	verbsx.Peer
	node *node
	rec  *record // from Connect; nil before

	// Lazy connection: asked says this rank put its request in the
	// peer's mailbox; Acked (verbsx.Peer) that the peer replied (it
	// knows the TGT QP of this rank's INI QP on its node, so frames may
	// go); known that the TGT QP of the peer's INI QP on this node is
	// known here (frames from it can be told apart); requested that its
	// request came (a second one is refused). With eager connection
	// asked and known are set at Connect.
	asked, known, requested bool
}

func newPeer(rank int, n *node) *peer {
	p := &peer{node: n}
	p.Peer = verbsx.Peer{Rank: rank, Conn: &n.ini}
	return p
}
