package rc

import "github.com/xrcrun/xrc/transport/internal/verbsx"

// peer is a remote rank as this transport sees it: its record, and the
// QP toward it (conn) with the flow control of the frames both ways
// (verbsx.Peer, whose Conn is conn). Owned by the goroutine that calls
// the transport's methods.
type peer struct {
	verbsx.Peer
	conn verbsx.Conn
	rec  *record // from Connect; nil before
	// peerReady says the peer's QP is up (lazy connection: its ready
	// came).
	peerReady bool
}

func newPeer(rank int) *peer {
	p := &peer{conn: verbsx.RankConn(rank)}
	p.Peer = verbsx.Peer{Rank: rank, Conn: &p.conn, Acked: true}
	return p
}
