package comm

import (
	"errors"
	"fmt"

	"github.com/xrcrun/xrc/transport"
)

// Deliver takes a frame from world rank from (transport.Handler). The
// engine's lock is held: progress runs under it.
func (e *engine) Deliver(from int, f []byte) {
	h, body, err := parseFrame(f)
	if err != nil {
		e.bad++
		e.log.Warn("dropped a frame", "from", from, "err", err)
		return
	}
	switch h.kind {
	case kindPush:
		e.push(from, h)
		return
	case kindData:
		e.pushed(from, h, body)
		return
	}
	if h.kind == kindFIN {
		r := e.sends[h.id]
		if r == nil || r.rdvWorld != from {
			e.bad++
			e.log.Warn("finish frame for no send", "from", from, "id", h.id)
			return
		}
		delete(e.sends, h.id)
		err := r.tr.Unexpose(r.remote)
		r.complete(r.st, err)
		return
	}
	in := inMsg{h: h, world: from}
	for i, r := range e.posted[h.ctx] {
		if r.c.matches(r, &in) {
			e.posted[h.ctx] = removeAt(e.posted[h.ctx], i)
			e.deliverTo(r, &in, body)
			return
		}
	}
	// Unexpected: keep a copy, since body is the transport's until we
	// return.
	m := &inMsg{h: h, world: from}
	if h.kind == kindEager {
		m.data = append([]byte(nil), body...)
	} else {
		m.remote = append(transport.Remote(nil), body...)
	}
	e.unexpected[h.ctx] = append(e.unexpected[h.ctx], m)
	close(e.arrived)
	e.arrived = make(chan struct{})
}

// matches reports whether message m (in c's context) is for receive r: its
// source and tag, and a sender that is the communicator's member it says
// it is.
func (c *Comm) matches(r *Request, m *inMsg) bool {
	src := int(m.h.src)
	if src >= c.size || c.ranks[src] != m.world {
		return false
	}
	return (r.src == AnySource || r.src == src) && (r.tag == AnyTag || r.tag == int(m.h.tag))
}

// deliverTo gives message m to receive r: copies an eager payload, or
// starts pulling a rendezvous one. body is m's payload or Remote when m
// came just now, and nil when m was queued (its copies are in m).
func (e *engine) deliverTo(r *Request, m *inMsg, body []byte) {
	st := Status{Source: int(m.h.src), Tag: int(m.h.tag)}
	if m.h.kind == kindEager {
		if body == nil {
			body = m.data
		}
		st.Count = copy(r.buf, body)
		var err error
		if len(body) > len(r.buf) {
			err = &TruncateError{Len: len(body), Cap: len(r.buf)}
		}
		r.complete(st, err)
		return
	}
	if body == nil {
		body = m.remote
	}
	n := min(uint64(len(r.buf)), m.h.length)
	st.Count = int(n)
	r.st, r.trunc = st, m.h.length > uint64(len(r.buf))
	r.rdvWorld, r.rdvID, r.msgLen = m.world, m.h.id, m.h.length
	tr, err := e.route(m.world)
	if err == nil {
		e.nextID++
		e.pulls[e.nextID] = r
		if err = tr.Read(m.world, r.buf[:n], body, e.nextID); err != nil {
			delete(e.pulls, e.nextID)
		}
	}
	if err != nil {
		e.finish(r, fmt.Errorf("comm: pulling %d bytes from rank %d: %w", n, st.Source, err))
	}
}

// ReadDone completes a pull (transport.Handler).
func (e *engine) ReadDone(cookie uint64, err error) {
	r := e.pulls[cookie]
	if r == nil {
		e.bad++
		return
	}
	delete(e.pulls, cookie)
	if errors.Is(err, transport.ErrReadRefused) {
		// Ask the sender to push the message through the transport's
		// buffers instead.
		e.pushes[pushKey{r.rdvWorld, r.rdvID}] = &pushIn{r: r}
		var f [hdrLen]byte
		(&header{kind: kindPush, ctx: r.c.ctx, src: int32(r.c.rank), id: r.rdvID}).put(f[:])
		tr, rerr := e.route(r.rdvWorld)
		if rerr == nil {
			_, rerr = e.send(tr, r.rdvWorld, nil, f[:], nil)
		}
		if rerr == nil {
			return
		}
		delete(e.pushes, pushKey{r.rdvWorld, r.rdvID})
		err = errors.Join(err, rerr)
	}
	if err != nil {
		err = fmt.Errorf("comm: pulling %d bytes from rank %d: %w", r.st.Count, r.st.Source, err)
	}
	e.finish(r, err)
}

// finish ends a rendezvous receive: the sender learns that its buffer is
// free, and the receive completes.
func (e *engine) finish(r *Request, err error) {
	if serr := e.sendFIN(r.rdvWorld, r.c.ctx, r.c.rank, r.rdvID); serr != nil && err == nil {
		err = serr
	}
	if err == nil && r.trunc {
		err = &TruncateError{Len: int(r.msgLen), Cap: len(r.buf)}
	}
	r.complete(r.st, err)
}

// sendFIN tells world rank to, the sender of large message id in context
// ctx, that its buffer is free (this rank is src in ctx's communicator). A
// rank no transport reaches is not told (the route's error is not
// returned); a failed send is.
func (e *engine) sendFIN(to int, ctx uint32, src int, id uint64) error {
	var fin [hdrLen]byte
	(&header{kind: kindFIN, ctx: ctx, src: int32(src), id: id}).put(fin[:])
	tr, err := e.route(to)
	if err != nil {
		return nil
	}
	_, err = e.send(tr, to, nil, fin[:], nil)
	return err
}

// takeUnexpected removes and returns the first queued message of c's
// context that r matches, or nil.
func (e *engine) takeUnexpected(c *Comm, r *Request) *inMsg {
	q := e.unexpected[c.ctx]
	for i, m := range q {
		if c.matches(r, m) {
			e.unexpected[c.ctx] = removeAt(q, i)
			return m
		}
	}
	return nil
}

// removeAt removes q[i], keeping the order of the rest. The first element,
// the common case of a queue matched in order, goes without moving the
// others.
func removeAt[T any](q []*T, i int) []*T {
	if i == 0 {
		q[0] = nil
		if len(q) == 1 {
			return q[:0] // the array stays, for the next append
		}
		return q[1:]
	}
	copy(q[i:], q[i+1:])
	q[len(q)-1] = nil
	return q[:len(q)-1]
}

// pushKey names a message being pushed: its sender's world rank and the
// sender's request id.
type pushKey struct {
	world int
	id    uint64
}

// pushIn is a receive whose message comes in data frames.
type pushIn struct {
	r   *Request
	got uint64
}

// push answers a receiver that cannot pull message h.id: the message goes
// in data frames of at most eagerMax bytes, behind which the receiver's
// finish frame completes the send as usual. The lock is held.
func (e *engine) push(from int, h header) {
	r := e.sends[h.id]
	if r == nil || r.rdvWorld != from {
		e.bad++
		e.log.Warn("push request for no send", "from", from, "id", h.id)
		return
	}
	tr, err := e.route(from)
	if err != nil {
		return
	}
	chunk := max(e.eagerMax, 1)
	for off := 0; off < len(r.sbuf); off += chunk {
		var f [hdrLen]byte
		(&header{kind: kindData, ctx: r.c.ctx, src: int32(r.c.rank), length: uint64(off), id: h.id}).put(f[:])
		if _, err := e.send(tr, from, nil, f[:], r.sbuf[off:min(off+chunk, len(r.sbuf))]); err != nil {
			e.log.Error("pushing a message", "to", from, "err", err)
			return
		}
	}
}

// pushed takes a data frame of a message being pushed to a receive of
// this rank; the last one finishes the receive. The lock is held.
func (e *engine) pushed(from int, h header, body []byte) {
	k := pushKey{from, h.id}
	p := e.pushes[k]
	if p == nil || h.length+uint64(len(body)) > p.r.msgLen {
		e.bad++
		e.log.Warn("data frame for no receive", "from", from, "id", h.id, "offset", h.length)
		return
	}
	if h.length < uint64(len(p.r.buf)) {
		copy(p.r.buf[h.length:], body)
	}
	if p.got += uint64(len(body)); p.got >= p.r.msgLen {
		delete(e.pushes, k)
		e.finish(p.r, nil)
	}
}

// PeerFailed fails what waits for rank (a world rank), which a transport
// says it no longer carries traffic from (shm: its ring was corrupt; rc,
// xrc: a QP that carried its traffic failed), with err: the receives
// posted for a message from it, and later ones (irecv),
// probes of it once no message of its is queued (probe), the rendezvous
// sends to it (whose finish cannot come; their buffers go back to their
// callers though rank might still be reading them) and the receives it was
// pushing, and the frames queued for it. Receives from any source stay
// posted for the others' messages, until every other rank of their
// communicator has failed (sourceFailed). Progress calls it, with the lock
// held.
func (e *engine) PeerFailed(rank int, err error) {
	if e.failed == nil {
		e.failed = map[int]failure{}
	}
	f, again := e.failed[rank]
	if !again {
		f.before = len(e.failed)
	}
	f.err = err
	e.failed[rank] = f
	e.log.Error("comm: no more traffic from a rank", "rank", rank, "err", err)
	for ctx, q := range e.posted {
		kept := q[:0]
		for _, r := range q {
			if r.src == AnySource || r.c.ranks[r.src] == rank {
				if err := r.c.sourceFailed(r.src); err != nil {
					r.complete(Status{Source: r.src, Tag: r.tag}, err)
					continue
				}
			}
			kept = append(kept, r)
		}
		clear(q[len(kept):])
		e.posted[ctx] = kept
	}
	qs := e.backlog[rank]
	delete(e.backlog, rank)
	e.dropBacklog(rank, qs, err)
	close(e.arrived) // a probe of rank learns it
	e.arrived = make(chan struct{})
}

// sourceFailed returns why nothing more can come to c from src: the
// error of its failure (PeerFailed), or for AnySource, once every rank of
// c but this one has failed, the error of the first of them to fail
// (ULFM fails a wildcard receive once any rank has failed; this waits for
// all, so that receives from the living carry on). Messages a rank might
// still send itself do not keep such a receive posted. The lock is held.
func (c *Comm) sourceFailed(src int) error {
	e := c.e
	if len(e.failed) == 0 {
		return nil
	}
	if src != AnySource {
		return e.failed[c.ranks[src]].err
	}
	if len(c.ranks) < 2 || len(e.failed) < len(c.ranks)-1 {
		return nil
	}
	var first failure // of the ranks of c, the one that failed first
	for i, w := range c.ranks {
		if i == c.rank {
			continue
		}
		f, ok := e.failed[w]
		if !ok {
			return nil
		}
		if first.err == nil || f.before < first.before {
			first = f
		}
	}
	return fmt.Errorf("comm: every other rank of the communicator has failed: %w", first.err)
}

// failure is why a transport stopped carrying a rank's traffic
// (PeerFailed), and how many ranks had failed before it.
type failure struct {
	err    error
	before int
}

// dropCollective drops the messages waiting in c's collective context, to
// be freed: what peers sent to collectives of c that failed or were
// cancelled on this rank, which no call can take now. A large message's
// sender gets its finish frame, as if it had been received, so that its
// send completes. The lock is held.
func (e *engine) dropCollective(c *Comm) {
	ctx := c.ctx | collBit
	q := e.unexpected[ctx]
	if len(q) == 0 {
		return
	}
	for _, m := range q {
		if m.h.kind != kindEager {
			e.sendFIN(m.world, ctx, c.rank, m.h.id)
		}
	}
	e.log.Debug("comm: free: dropped messages of failed collectives", "messages", len(q))
	delete(e.unexpected, ctx)
}
