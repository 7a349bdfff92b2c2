package xrc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/transport/internal/verbsx"
)

// Lazy connection, through write-once keys of the bootstrap server.
//
// Every rank has a mailbox: the keys "xrc/mbox/RANK/0", "xrc/mbox/RANK/1",
// …, each holding one message (record.go), put in the first free slot. A
// goroutine reads the rank's own mailbox in order.
//
//   - A rank S that first needs a rank B of node Y (TrySend or Read)
//     makes its INI QP toward Y if it has none (INIT) and puts a request
//     (S, the INI QPN, its first PSN) in B's mailbox. It asks each rank it
//     talks to once; the INI QP is shared.
//   - B claims the TGT QP of S's INI QP on node Y: Put of the key
//     "xrc/claim/Y/S". The first rank of Y to claim it creates the TGT QP,
//     brings it to RTR toward the INI QP and publishes its number under
//     "xrc/tgt/Y/S"; a rank whose claim fails (ErrKeyExists: another rank
//     of Y was asked by S too) gets the number there (waiting until it is
//     put) and opens the QP (XRCD.OpenQP). Either way B now tells S's
//     frames apart by the TGT QPN, and puts a reply (B, TGT QPN) in S's
//     mailbox. B also asks S in turn, if it has not, so that it can return
//     credits.
//   - S, at the first reply from a rank of Y, brings its INI QP to RTS
//     toward the TGT QP; a rank whose reply came may get frames. Reads
//     need only the INI QP at RTS.
//   - A rank of Y that cannot create (or open) the TGT QP fails its own
//     INI QP toward S's node and puts a refusal in S's mailbox, and S
//     fails its INI QP toward Y: without the TGT QP it reaches no rank
//     of Y. The rank that created it also publishes TGT QPN 0, so that
//     the other ranks of Y that S asked, waiting for the number, fail
//     too instead of waiting until Close. Once its INI QP toward S's
//     node failed, a rank refuses the later requests of that node's ranks
//     (it could not return their credits) and gives up the claims it
//     still had under way, publishing 0 for one it won.
//
// Bootstrap calls block, so they run in goroutines; the verbs work and
// the transport's state change only in Progress (Apply).
type lazy struct {
	t    *Transport
	boot *bootstrap.Client
	mbox *verbsx.Mailbox
	ctx  context.Context // the transport's: ends at Close

	// connected is set once Connect has the records the messages refer to.
	connected atomic.Bool

	mu   sync.Mutex
	acts []action // guarded by mu: learned by the goroutines, not applied yet
}

// An action is what a goroutine hands to Progress.
type action struct {
	kind actKind
	m    message // the request or reply it is about
	qpn  uint32  // actOpen: the TGT QP to open
	err  error   // actFail
}

type actKind uint8

const (
	actRequest actKind = iota // a request came: claim the TGT QP
	actReply                  // a reply came
	actRefusal                // a refusal came
	actCreate                 // the claim succeeded: create the TGT QP
	actOpen                   // the claim failed: open the TGT QP qpn
	actFail                   // a bootstrap call toward m.rank failed
)

func newLazy(t *Transport, ctx context.Context) *lazy {
	return &lazy{t: t, boot: t.cfg.Bootstrap, mbox: verbsx.NewMailbox(t.cfg.Bootstrap, "xrc"), ctx: ctx}
}

func claimKey(node, rank int) string { return fmt.Sprintf("xrc/claim/%d/%d", node, rank) }
func tgtKey(node, rank int) string   { return fmt.Sprintf("xrc/tgt/%d/%d", node, rank) }

func (l *lazy) push(a action) {
	l.mu.Lock()
	l.acts = append(l.acts, a)
	l.mu.Unlock()
	l.t.cfg.Kick()
}

// Start is start for verbsx (TrySend, Read).
func (l *lazy) Start(vp *verbsx.Peer) error { return l.start(l.t.peers[vp.Rank]) }

// start makes the INI QP toward p's node if there is none and asks p.
// Called by the goroutine driving the transport; the error is that of
// p's node, failed.
func (l *lazy) start(p *peer) error {
	n, t := p.node, l.t
	if n.ini.State() == verbsx.ConnFailed {
		return n.ini.Err()
	}
	if p.asked {
		return nil
	}
	if n.ini.QP == nil {
		if err := t.createINI(n); err != nil {
			t.e.Fail(&n.ini, err)
			return err
		}
	}
	p.asked = true
	req := message{kind: msgRequest, rank: t.cfg.Rank, qpn: n.ini.QP.Num(), psn: n.ini.PSN}
	t.e.Go(func() { l.put(p.Rank, req) })
	return nil
}

// put puts m in rank's mailbox.
func (l *lazy) put(rank int, m message) {
	if err := l.mbox.Put(l.ctx, rank, m.encode()); err != nil && l.ctx.Err() == nil {
		l.push(action{kind: actFail, m: message{rank: rank}, err: fmt.Errorf("mailbox of rank %d: %w", rank, err)})
	}
}

// readMailbox takes this rank's messages in order until ctx ends.
func (l *lazy) readMailbox(ctx context.Context) {
	err := l.mbox.Read(ctx, l.t.cfg.Rank, func(slot int, v []byte) {
		m, err := parseMessage(v, l.t.n)
		if err != nil {
			l.t.m.Bad.Inc()
			l.t.log.Warn("lazy connect: dropped a message", "slot", slot, "err", err)
			return
		}
		kind := actRequest
		switch m.kind {
		case msgReply:
			kind = actReply
		case msgRefusal:
			kind = actRefusal
		}
		l.push(action{kind: kind, m: m})
	})
	if ctx.Err() == nil {
		l.t.log.Error("lazy connect: mailbox", "err", err)
	}
}

// claim claims the TGT QP of the INI QP of req's sender on this node.
func (l *lazy) claim(req message) {
	me := l.t.cfg.Nodes[l.t.cfg.Rank]
	err := l.boot.Put(l.ctx, claimKey(me, req.rank), binary.LittleEndian.AppendUint32(nil, uint32(l.t.cfg.Rank)))
	switch {
	case err == nil:
		l.push(action{kind: actCreate, m: req})
		return
	case errors.Is(err, bootstrap.ErrKeyExists):
		var v []byte
		if v, err = l.boot.Get(l.ctx, tgtKey(me, req.rank)); err == nil {
			if len(v) == 4 && binary.LittleEndian.Uint32(v) == 0 {
				err = errors.New("the rank of this node that claimed it could not create it")
			} else if len(v) != 4 || !validNum(binary.LittleEndian.Uint32(v)) {
				l.t.m.Bad.Inc()
				err = fmt.Errorf("%w: TGT QP number %x for rank %d", errRecord, v, req.rank)
			} else {
				l.push(action{kind: actOpen, m: req, qpn: binary.LittleEndian.Uint32(v)})
				return
			}
		}
	}
	if l.ctx.Err() == nil {
		l.push(action{kind: actFail, m: req, err: fmt.Errorf("claim the TGT QP of rank %d: %w", req.rank, err)})
	}
}

// publish makes the TGT QP num, created for rank's INI QP, known to the
// other ranks of the node, then replies to rank.
func (l *lazy) publish(rank int, num uint32) {
	me := l.t.cfg.Nodes[l.t.cfg.Rank]
	if err := l.boot.Put(l.ctx, tgtKey(me, rank), binary.LittleEndian.AppendUint32(nil, num)); err != nil {
		if l.ctx.Err() == nil {
			l.push(action{kind: actFail, m: message{rank: rank}, err: fmt.Errorf("publish the TGT QP of rank %d: %w", rank, err)})
		}
		return
	}
	l.put(rank, message{kind: msgReply, rank: l.t.cfg.Rank, qpn: num})
}

// refuse tells rank that this rank could not create (publish) or open
// the TGT QP of its INI QP ini.
func (l *lazy) refuse(rank int, ini uint32, publish bool) {
	if publish {
		me := l.t.cfg.Nodes[l.t.cfg.Rank]
		if err := l.boot.Put(l.ctx, tgtKey(me, rank), binary.LittleEndian.AppendUint32(nil, 0)); err != nil {
			// The node's other ranks that rank asked wait until Close;
			// rank learns of the failure all the same.
			l.t.log.Warn("lazy connect: publish a failed TGT QP", "rank", rank, "err", err)
		}
	}
	l.put(rank, message{kind: msgRefusal, rank: l.t.cfg.Rank, qpn: ini})
}

// Apply carries out the actions the goroutines handed over. Called by
// Progress.
func (l *lazy) Apply() {
	if !l.connected.Load() {
		return
	}
	l.mu.Lock()
	acts := l.acts
	l.acts = nil
	l.mu.Unlock()
	t := l.t
	for _, a := range acts {
		p := t.peers[a.m.rank]
		if p == nil {
			t.m.Bad.Inc()
			t.log.Warn("lazy connect: a message from a rank of this node", "from", a.m.rank)
			continue
		}
		n := p.node
		if n.ini.State() == verbsx.ConnFailed {
			l.refuseFailed(p, a)
			continue
		}
		if err := l.do(p, a); err != nil {
			t.e.Fail(&n.ini, err)
		}
	}
}

// refuseFailed answers a of p, whose node this rank's INI QP toward
// failed: a request is refused (this rank could never return credits to
// p, and p would wait for a reply), and a claim it won or lost is given
// up (publishing TGT QPN 0 when it won, so that the node's other ranks p
// asked do not wait for the number). The rest needs no answer.
func (l *lazy) refuseFailed(p *peer, a action) {
	switch a.kind {
	case actRequest:
		if p.requested {
			l.t.m.Bad.Inc()
			return
		}
		p.requested = true
		l.t.e.Go(func() { l.refuse(p.Rank, a.m.qpn, false) })
	case actCreate, actOpen:
		l.t.e.Go(func() { l.refuse(p.Rank, a.m.qpn, a.kind == actCreate) })
	}
}

func (l *lazy) do(p *peer, a action) error {
	t, n := l.t, p.node
	switch a.kind {
	case actRequest:
		if p.requested || p.known || t.tgts[p.Rank] != nil {
			t.m.Bad.Inc()
			t.log.Warn("lazy connect: a second request", "from", p.Rank)
			return nil
		}
		p.requested = true
		t.e.Go(func() { l.claim(a.m) })
		// Frames from p need credits returned: ask p in turn.
		return l.start(p)
	case actCreate:
		g, err := t.createTGT(p.Rank)
		if err == nil {
			err = t.connectTGT(g, p, a.m.qpn, a.m.psn)
		}
		if err != nil {
			t.e.Go(func() { l.refuse(p.Rank, a.m.qpn, true) })
			return err
		}
		num := g.qp.Num()
		t.e.Go(func() { l.publish(p.Rank, num) })
	case actOpen:
		if err := t.openTGT(p, a.qpn); err != nil {
			t.e.Go(func() { l.refuse(p.Rank, a.m.qpn, false) })
			return err
		}
		reply := message{kind: msgReply, rank: t.cfg.Rank, qpn: a.qpn}
		t.e.Go(func() { l.put(p.Rank, reply) })
	case actReply:
		switch {
		case !p.asked || p.Acked:
			t.m.Bad.Inc()
			t.log.Warn("lazy connect: an unexpected reply", "from", p.Rank)
			return nil
		case n.ini.State() == verbsx.ConnConnecting:
			if err := t.connectINI(n, a.m.qpn, p.rec.gid, p.rec.mtu); err != nil {
				return err
			}
		case n.tgt != a.m.qpn:
			return n.ini.Errorf("rank %d names TGT QP %#x, the INI QP is connected to %#x", p.Rank, a.m.qpn, n.tgt)
		}
		p.Acked = true
		t.e.MarkDirty(&n.ini)
	case actRefusal:
		if !p.asked || n.ini.QP == nil || a.m.qpn != n.ini.QP.Num() {
			t.m.Bad.Inc()
			t.log.Warn("lazy connect: an unexpected refusal", "from", p.Rank)
			return nil
		}
		return n.ini.Errorf("rank %d could not create or open the TGT QP of INI QP %#x", p.Rank, a.m.qpn)
	case actFail:
		return n.ini.Errorf("lazy connect: %w", a.err)
	}
	return nil
}
