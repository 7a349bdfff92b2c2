package rc

import (
	"fmt"
	"time"

	"github.com/xrcrun/xrc/transport/internal/verbsx"
	"github.com/xrcrun/xrc/verbs"
)

// peer is a remote rank as this transport sees it: its record, the QP
// toward it and the flow control of the frames both ways. It is owned by
// the goroutine that calls the transport's methods.
type peer struct {
	rank  int
	rec   *record   // from Connect; nil before
	qp    *verbs.QP // nil until made (lazy connection)
	psn   uint32    // the QP's first send PSN
	state peerState
	// started is when the QP was made (for the lazy handshake's time).
	started time.Time
	err     error // why the peer failed; returned by every later call

	sqUsed   int            // send work requests not completed yet
	readsOut int            // RDMA READs posted and not completed
	pending  []verbsx.Chunk // RDMA READs waiting for room
	dirty    bool           // in Transport.dirty

	cr verbsx.Credits // flow control of the frames both ways
}

type peerState uint8

const (
	peerIdle       peerState = iota // no QP yet (lazy)
	peerConnecting                  // QP in INIT, waiting for the peer's QPN
	peerReady                       // QP in RTS
	peerFailed
)

// fail marks p failed with err (which names the peer): every later call
// toward it returns err, and its queued reads end with it.
func (t *Transport) fail(p *peer, err error) {
	if p.state == peerFailed {
		return
	}
	t.log.Error("peer failed", "peer", p.rank, "err", err)
	t.m.PeerErrors.Inc()
	p.state, p.err = peerFailed, err
	t.core.Reads.Fail(p.pending, err)
	p.pending = nil
}

func (t *Transport) markDirty(p *peer) {
	if !p.dirty {
		p.dirty = true
		t.dirty = append(t.dirty, p)
	}
}

func peerError(p *peer, format string, args ...any) error {
	return fmt.Errorf("rc: rank %d: "+format, append([]any{p.rank}, args...)...)
}
