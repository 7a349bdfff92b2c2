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
//
// The transport makes a Conn (RankConn, NodeConn) and only reads it; the
// Endpoint writes it: NewEndpoint names the transport in its errors,
// MakeQP sets QP and PSN and the state ConnConnecting, BringUp
// ConnReady, Fail ConnFailed and Err, Hold and Release whether work may
// go on a ready QP, and Free clears QP.
type Conn struct {
	QP  *verbs.QP // nil until made (lazy connection)
	PSN uint32    // the QP's first send PSN

	state   ConnState
	err     error     // why the QP failed; returned by every later call
	started time.Time // when the QP was made (the lazy handshake's time)

	// sqUsed bounds the QP's outstanding work requests (sends, credit
	// messages, reads) to its send queue; readsOut bounds its RDMA READs
	// to max_rd_atomic.
	sqUsed, readsOut int
	pending          []Chunk // RDMA READs waiting for room or for the QP
	dirty            bool    // in Endpoint.dirtyConns
	held             bool    // nothing goes on the QP until Release (Hold)

	// Whom the QP reaches, for errors and logs: the transport's name (set
	// by NewEndpoint), and the rank, or with node the node, id.
	name string
	node bool
	id   int
}

// ConnState is how far a Conn's QP is.
type ConnState uint8

const (
	ConnIdle       ConnState = iota // no QP yet (lazy connection)
	ConnConnecting                  // QP in INIT, waiting for the remote QP's number
	ConnReady                       // QP in RTS
	ConnFailed                      // for good: see Err
)

// RankConn is the Conn toward one rank (RC).
func RankConn(rank int) Conn { return Conn{id: rank} }

// NodeConn is the Conn toward the ranks of a node (XRC).
func NodeConn(node int) Conn { return Conn{node: true, id: node} }

// State is how far c's QP is.
func (c *Conn) State() ConnState { return c.state }

// Err is why c failed (nil unless its State is ConnFailed); every call
// toward the ranks c reaches returns it.
func (c *Conn) Err() error { return c.err }

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

// Fail marks c failed with err (which names whom c reaches): every later
// call toward its peers returns err, its queued reads end with it, and
// Progress reports each of its peers failed (FailPeer).
func (e *Endpoint) Fail(c *Conn, err error) {
	if c.state == ConnFailed {
		return
	}
	if c.node {
		e.log.Error("node failed", "node", c.id, "err", err)
	} else {
		e.log.Error("peer failed", "peer", c.id, "err", err)
	}
	c.state, c.err = ConnFailed, err
	e.Core.Reads.Fail(c.pending, err)
	c.pending = nil
	for _, p := range e.peers {
		if p != nil && p.Conn == c {
			e.failPeer(p, err)
		}
	}
}

// FailPeer marks p failed with err (which names it) while its Conn may
// still carry traffic toward others (XRC: the TGT QP p's frames come
// through failed): every later call toward p returns err, and Progress
// reports p failed. Its reads already posted end as their completions
// come.
func (e *Endpoint) FailPeer(p *Peer, err error) {
	if p.err == nil {
		e.log.Error("peer failed", "peer", p.Rank, "err", err)
	}
	e.failPeer(p, err)
}

// failPeer marks p failed with err, the first time, and queues it for
// Progress to report (report).
func (e *Endpoint) failPeer(p *Peer, err error) {
	if p.err != nil {
		return
	}
	p.err = err
	e.m.PeerErrors.Inc()
	e.failed = append(e.failed, p)
}

// Peer is a remote rank: the Conn toward it, the SRQ its frames and reads
// name (XRC), and the credits of the frames both ways. Owned by the
// goroutine driving the transport, which sets its exported fields; the
// Endpoint only reads them.
type Peer struct {
	Rank int
	Conn *Conn
	SRQN uint32 // its XRC SRQ, which every send and read toward it names; 0 for RC
	// Recorded says Connect read the peer's record: calls toward it may
	// go. Acked says frames may go once Conn is ready: RC sets it at once;
	// XRC once the peer replied (it knows the TGT QP of this rank's INI
	// QP on its node).
	Recorded, Acked bool

	cr      Credits
	credits uint32 // the frames it may hold unconsumed from this rank: its share
	dirty   bool   // has credits to return (in Endpoint.dirtyPeers)

	// err is why p failed for good (its Conn's error, or FailPeer's):
	// every later call toward p returns it. reported says Progress told a
	// transport.PeerFailureHandler; frames of p that come later are
	// dropped.
	err      error
	reported bool
}

// Ready reports whether frames may go to p now.
func (p *Peer) Ready() bool { return p.Acked && p.Conn.up() }

// up reports whether work may go on c's QP.
func (c *Conn) up() bool { return c.state == ConnReady && !c.held }

// Hold keeps frames, credit messages and reads off c's QP, even once it is
// up, until Release: for a transport whose peer's QP may not be ready to
// receive when this one is (a lazy RC connection whose other side has not
// said so yet). What the QP would carry waits, as before it was up.
func (e *Endpoint) Hold(c *Conn) { c.held = true }

// Release lets work go on c's QP again, and posts its waiting reads.
func (e *Endpoint) Release(c *Conn) {
	if c.held {
		c.held = false
		e.MarkDirty(c)
	}
}
