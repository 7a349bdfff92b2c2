package rc

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/xrcrun/xrc/transport/internal/verbsx"
)

// Lazy connection. Every rank has a mailbox (verbsx.Mailbox, keys
// "rc/mbox/RANK/SLOT"), each slot holding one message (record.go): a
// hello (sender rank, the QPN it made for the mailbox's owner, its first
// PSN), a ready or a refusal.
//
//   - A rank that first needs a peer (TrySend or Read) makes its QP for it
//     (INIT) and puts a hello in the peer's mailbox, in the first slot free
//     (Put of a taken key fails with ErrKeyExists: the next one is tried).
//
//   - Each rank reads its own mailbox in order, one Get at a time, in a
//     goroutine. For a hello from a peer it has no QP for, it makes one
//     and puts its own hello in the sender's mailbox; then (in either case)
//     it brings its QP to RTS toward the QPN of the hello.
//
//   - Once its QP is at RTS, a rank puts a ready in the peer's mailbox, or
//     a refusal if it could not make or bring up its QP (the peer then
//     fails the connection, which would otherwise wait for the ready).
//     Nothing goes on the QP until the peer's ready came: the side that
//     answers reaches RTS first, and what it sent before the starter's QP
//     was at RTR would be retransmitted only until the retries ran out
//     (about 3 s), so that a starter busy computing that long would lose
//     the connection. The starter usually has the answerer's ready by the
//     time its QP is up.
//
// So each side of a connection puts exactly one hello and one ready and
// reads them from the other, whoever started, and two ranks that start at
// once simply cross. Only the bootstrap goroutines block; the verbs work
// happens in Progress (Apply).
type lazy struct {
	t    *Transport
	mbox *verbsx.Mailbox
	ctx  context.Context // the transport's: ends at Close

	// connected is set once Connect has the records that hellos refer to.
	connected atomic.Bool

	mu     sync.Mutex
	hellos []hello       // guarded by mu: read from the mailbox, not applied yet
	failed map[int]error // guarded by mu: peers whose hello could not be put
}

// Start is start for verbsx (TrySend, Read).
func (l *lazy) Start(vp *verbsx.Peer) error { return l.start(l.t.peers[vp.Rank]) }

// start makes p's QP and sends the peer a hello. Called by the goroutine
// driving the transport.
func (l *lazy) start(p *peer) error {
	if p.conn.State() != verbsx.ConnIdle {
		return nil
	}
	if err := l.t.createQP(p); err != nil {
		err = p.conn.Errorf("lazy connect: %w", err)
		l.t.e.Fail(&p.conn, err)
		return err
	}
	l.t.e.Hold(&p.conn) // until the peer's ready
	h := hello{kind: kindHello, rank: l.t.cfg.Rank, qpn: p.conn.QP.Num(), psn: p.conn.PSN}
	l.t.e.Go(func() { l.put(p.Rank, h) })
	return nil
}

// put puts h in rank's mailbox.
func (l *lazy) put(rank int, h hello) {
	if err := l.mbox.Put(l.ctx, rank, h.encode()); err != nil && l.ctx.Err() == nil {
		l.mu.Lock()
		l.failed[rank] = err
		l.mu.Unlock()
		l.t.cfg.Kick()
	}
}

// readMailbox takes this rank's hellos in order until ctx ends.
func (l *lazy) readMailbox(ctx context.Context) {
	err := l.mbox.Read(ctx, l.t.cfg.Rank, func(slot int, v []byte) {
		h, err := parseHello(v, l.t.n)
		if err != nil {
			l.t.m.Bad.Inc()
			l.t.log.Warn("lazy connect: dropped a request", "slot", slot, "err", err)
			return
		}
		l.mu.Lock()
		l.hellos = append(l.hellos, h)
		l.mu.Unlock()
		l.t.cfg.Kick()
	})
	if ctx.Err() == nil {
		l.t.log.Error("lazy connect: mailbox", "err", err)
	}
}

// Apply connects the QPs of the hellos that came, and fails the peers
// whose hello could not be put. Called by Progress.
func (l *lazy) Apply() {
	if !l.connected.Load() {
		return
	}
	l.mu.Lock()
	hs, failed := l.hellos, l.failed
	l.hellos = nil
	if len(failed) > 0 {
		l.failed = map[int]error{}
	}
	l.mu.Unlock()
	t := l.t
	for rank, err := range failed {
		if p := t.peers[rank]; p != nil {
			t.e.Fail(&p.conn, p.conn.Errorf("lazy connect: %w", err))
		}
	}
	for _, h := range hs {
		p := t.peers[h.rank]
		switch {
		case p != nil && h.kind == kindReady && !p.peerReady:
			p.peerReady = true
			l.release(p)
			continue
		case p != nil && h.kind == kindRefusal && p.conn.QP != nil && h.qpn == p.conn.QP.Num():
			// It answers the hello of this rank's QP toward p (a
			// refusal names that QP), and no other.
			t.e.Fail(&p.conn, p.conn.Errorf("lazy connect: rank %d could not bring its QP up", p.Rank))
			continue
		}
		if p == nil || h.kind != kindHello || p.conn.State() == verbsx.ConnReady {
			t.m.Bad.Inc()
			t.log.Warn("lazy connect: unexpected message", "from", h.rank, "kind", h.kind)
			continue
		}
		answer := hello{kind: kindReady, rank: t.cfg.Rank}
		if l.connect(p, h) {
			answer.qpn = p.conn.QP.Num()
		} else {
			answer.kind, answer.qpn = kindRefusal, h.qpn
		}
		t.e.Go(func() { l.put(p.Rank, answer) })
		l.release(p)
	}
}

// connect brings p's QP up toward the QP of p's hello h, making it first
// if this rank has none, and reports whether it is up; a failure fails
// p's connection.
func (l *lazy) connect(p *peer, h hello) bool {
	if p.conn.State() == verbsx.ConnFailed || l.start(p) != nil {
		return false
	}
	if err := l.t.bringUp(p, h.qpn, h.psn); err != nil {
		l.t.e.Fail(&p.conn, err)
		return false
	}
	return true
}

// release lets frames and reads go to p once both QPs are up: this
// rank's, and the peer's (its ready came).
func (l *lazy) release(p *peer) {
	if p.peerReady && p.conn.State() == verbsx.ConnReady {
		l.t.e.Release(&p.conn)
	}
}
