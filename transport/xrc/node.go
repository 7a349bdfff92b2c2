package xrc

import (
	"fmt"
	"time"

	"github.com/xrcrun/xrc/transport/internal/verbsx"
	"github.com/xrcrun/xrc/verbs"
)

// node is a remote node as this rank sees it: its ranks and this rank's
// INI QP toward it, whose send queue is shared by the sends and reads
// toward all of them. Owned by the goroutine driving the transport.
type node struct {
	id    int
	peers []*peer // the node's ranks
	ini   *verbs.QP
	psn   uint32 // the INI QP's first send PSN
	tgt   uint32 // the TGT QP on the node that the INI QP is connected to
	state connState
	err   error // why the INI QP failed
	// started is when the INI QP was made (lazy handshake time).
	started time.Time

	// sqUsed bounds the INI QP's outstanding work requests (sends,
	// credit messages, reads) to its send queue, for all peers at once;
	// readsOut bounds its RDMA READs to max_rd_atomic.
	sqUsed, readsOut int
	pending          []pendingRead // reads waiting for room or for the QP
	dirty            bool          // in Transport.dirty
}

type connState uint8

const (
	connIdle       connState = iota // no INI QP yet (lazy)
	connConnecting                  // INI QP in INIT, waiting for a TGT QPN
	connReady                       // INI QP in RTS
	connFailed
)

// pendingRead is a chunk of a Read waiting to be posted on the node's INI
// QP, with the SRQ number of the rank that exposed the memory: the READ
// names it, and the remote device checks the rkey against its PD.
type pendingRead struct {
	verbsx.Chunk
	srqn uint32
}

// peer is a remote rank: its record and SRQ number, the credits of the
// frames both ways, and, with lazy connection, how far the handshake with
// it is. Owned by the goroutine driving the transport.
type peer struct {
	rank int
	node *node
	rec  *record // from Connect; nil before
	srqn uint32  // its XRC SRQ: every send and read toward it names it
	cr   verbsx.Credits

	// Lazy connection: asked says this rank put its request in the
	// peer's mailbox; acked that the peer replied (it knows the TGT QP
	// of this rank's INI QP on its node, so frames may go); known that
	// the TGT QP of the peer's INI QP on this node is known here (frames
	// from it can be told apart). With eager connection all are set at
	// Connect.
	asked, acked, known bool
	dirty               bool // has credits to return (in Transport.dirty)
}

func (p *peer) ready() bool { return p.acked && p.node.state == connReady }

// fail marks n failed with err: every later call toward its ranks
// returns err, and its queued reads end with it.
func (t *Transport) fail(n *node, err error) {
	if n.state == connFailed {
		return
	}
	t.log.Error("node failed", "node", n.id, "err", err)
	t.m.PeerErrors.Add(float64(len(n.peers)))
	n.state, n.err = connFailed, err
	for _, c := range n.pending {
		t.core.Reads.ChunkDone(c.Op, err)
	}
	n.pending = nil
}

func (t *Transport) markDirty(n *node) {
	if !n.dirty {
		n.dirty = true
		t.dirty = append(t.dirty, n)
	}
}

func nodeError(n *node, format string, args ...any) error {
	return fmt.Errorf("xrc: node %d: "+format, append([]any{n.id}, args...)...)
}
