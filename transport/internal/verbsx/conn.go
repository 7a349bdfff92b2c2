package verbsx

import (
	"fmt"
	"time"

	"github.com/xrcrun/xrc/verbs"
)

// Conn is a send QP of a rank and the work queued on it: RC's QP toward
// one peer, or XRC's INI QP toward a node, shared by the frames, credit
// messages and reads toward every rank of the node. Owned by the
// goroutine driving the transport.
type Conn struct {
	QP      *verbs.QP // nil until made (lazy connection)
	PSN     uint32    // the QP's first send PSN
	State   ConnState
	Err     error     // why the QP failed; returned by every later call
	Started time.Time // when the QP was made (the lazy handshake's time)

	// SQUsed bounds the QP's outstanding work requests (sends, credit
	// messages, reads) to its send queue; ReadsOut bounds its RDMA READs
	// to max_rd_atomic.
	SQUsed, ReadsOut int
	Pending          []Chunk // RDMA READs waiting for room or for the QP
	dirty            bool    // in Endpoint.dirtyConns

	// Whom the QP reaches, for errors and logs: the transport's name,
	// and the rank, or with node the node, id.
	name string
	node bool
	id   int
}

// ConnState is how far a Conn's QP is.
type ConnState uint8

const (
	ConnIdle       ConnState = iota // no QP yet (lazy), or not connected yet
	ConnConnecting                  // QP in INIT, waiting for the remote QP's number
	ConnReady                       // QP in RTS
	ConnFailed
)

// RankConn is the Conn of transport name toward one rank (RC).
func RankConn(name string, rank int) Conn { return Conn{name: name, id: rank} }

// NodeConn is the Conn of transport name toward the ranks of a node (XRC).
func NodeConn(name string, node int) Conn { return Conn{name: name, node: true, id: node} }

// Errorf makes an error naming the transport and whom c reaches: "rc:
// rank 3: …" or "xrc: node 1: …".
func (c *Conn) Errorf(format string, args ...any) error {
	noun := "rank"
	if c.node {
		noun = "node"
	}
	return fmt.Errorf("%s: %s %d: "+format, append([]any{c.name, noun, c.id}, args...)...)
}

// postError is the error of a work request toward p that c could not
// post: what names it ("send", "credit message"), and the rank when c
// reaches a node.
func (c *Conn) postError(p *Peer, what string, err error) error {
	if c.node {
		return c.Errorf("%s to rank %d: %w", what, p.Rank, err)
	}
	return c.Errorf("%s: %w", what, err)
}

// Peer is a remote rank: the Conn toward it, the SRQ its frames and reads
// name (XRC), and the credits of the frames both ways. Owned by the
// goroutine driving the transport.
type Peer struct {
	Rank int
	Conn *Conn
	SRQN uint32 // its XRC SRQ, which every send and read toward it names; 0 for RC
	Cr   Credits
	// Recorded says Connect read the peer's record: calls toward it may
	// go. Acked says frames may go once Conn is ready: RC sets it at once;
	// XRC once the peer replied (it knows the TGT QP of this rank's INI
	// QP on its node).
	Recorded, Acked bool
	dirty           bool // has credits to return (in Endpoint.dirtyPeers)
}

// Ready reports whether frames may go to p now.
func (p *Peer) Ready() bool { return p.Acked && p.Conn.State == ConnReady }
