package bootstrap

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
)

// The job's state: what the server does with the requests of registered
// ranks. handle and lost take Server.mu; the ...Locked functions run with
// it held.

// Bounds on what one rank can make the server hold, besides the answers
// queued for it (maxQueued): gets waiting for keys nobody has put yet,
// and its parts in collectives the other ranks have not all entered. Each
// costs the server the request's own bytes until another rank acts, so
// without a bound a buggy rank (it holds the job's key: a bug, not an
// attacker) could grow the server's memory until it died and took every
// rank's job with it. A request past a bound is refused by aborting the
// job with an *AbortError naming the rank and the bound (refuseLocked),
// which every rank's client, the offender's included, ends with: the
// protocol has no answer that refuses one get or one collective and that
// every client understands (a put-done's error is ErrKeyExists, and a
// client before this bound took one for a get as an empty value), and a
// collective refused to one rank would leave its numbering out of step
// with the others' for good. The server itself goes on, and frees what
// the rank held. Refusals are counted by
// xrc_bootstrap_server_refused_requests_total{limit}.
const (
	// maxWaitingGets bounds the gets of one rank that wait for their key
	// at once. A Client has a get waiting only while a caller waits in
	// Get (one per goroutine), plus those whose contexts ended since its
	// last frame (their withdrawals go before its next frame, msgCancel):
	// about twice its concurrent Gets. The project's own ranks wait in at
	// most two mailbox reads (transport/rc and transport/xrc, one each)
	// and, in xrc's lazy connection, one claim per peer rank connecting to
	// this one at that moment: tens or hundreds, thousands in a large job.
	// 65,536 is far above that, and costs the server some MiB of
	// bookkeeping per rank (with the keys themselves bounded by
	// maxWaitingGetBytes).
	maxWaitingGets = 1 << 16

	// maxWaitingGetBytes bounds the bytes of the keys of one rank's
	// waiting gets (a key may be MaxKey, 4 KiB, long, so maxWaitingGets
	// of them would be 256 MiB). The project's keys are tens of bytes
	// ("rc/mbox/17/3"), so a healthy rank's waiting gets hold some KiB of
	// keys; 16 MiB would take 4,096 gets of the longest keys waiting at
	// once, or maxWaitingGets of 256 bytes.
	maxWaitingGetBytes = 16 << 20

	// maxCollectivesAhead bounds the collectives one rank may have entered
	// that are not complete: its parts (each up to MaxRecord, 64 MiB)
	// wait for the other ranks. A Client's AllGather and Barrier return
	// only once their collective is complete, so a rank whose collectives
	// are called one after the other enters collective N+1 only after N
	// completed, and is never more than one ahead; only collectives called
	// concurrently on one Client, or whose calls' contexts ended (the
	// part sent still counts), put it further ahead, one each. The
	// project calls them one at a time (comm's Init, Finalize and
	// NodeReports). 16 leaves room for concurrent callers, and bounds what
	// one rank's parts can cost the server to 16 × MaxRecord = 1 GiB
	// (MaxGather, the size of one all-gather result it is built to hold),
	// and the collectives under way at once to 16 (each also costs the
	// server some 25 bytes per rank of the job for its bookkeeping).
	maxCollectivesAhead = 16
)

// refuseLocked refuses c's request that would pass one of the bounds
// above (limit is the metric's label): the job aborts, naming the rank
// and reason, and what the rank held is freed.
func (s *Server) refuseLocked(c *sconn, limit, reason string) {
	s.m.refusedRequests.WithLabelValues(limit).Inc()
	s.log.Warn("bootstrap: a rank's request passes a bound; aborting the job", "rank", c.rank, "limit", limit, "reason", reason)
	s.abortLocked(&AbortError{Rank: c.rank, Blamed: true, Reason: cut(reason, maxReason)})
}

// handle serves one request of a registered rank. An error ends the
// rank's connection.
func (s *Server) handle(c *sconn, t msgType, p []byte) error {
	m, err := decodeMessage(t, p)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.left {
		return protoErr("unexpected", "a %v message after leave", t)
	}
	if int(s.joined.Load()) < s.size {
		// A client sends nothing before the member table, which comes
		// once every rank has joined.
		return protoErr("unexpected", "a %v message before every rank joined", t)
	}
	switch m := m.(type) {
	case *msgGather:
		return s.gatherLocked(c, m)
	case *msgPut:
		if s.abort != nil {
			return nil
		}
		if old, ok := s.kv[m.Key]; ok && string(old) != string(m.Val) {
			c.enqueue(appendFrame(nil, &msgPutDone{ID: m.ID, Err: fmt.Sprintf("key %q already holds a different value", cut(m.Key, 256))}), nil)
			return nil
		}
		s.kv[m.Key] = m.Val
		c.enqueue(appendFrame(nil, &msgPutDone{ID: m.ID}), nil)
		for _, g := range s.gets[m.Key] {
			delete(g.c.gets, g.id)
			g.c.getBytes -= len(m.Key)
			g.c.enqueue(gotFrame(g.id, m.Val))
		}
		delete(s.gets, m.Key)
	case *msgGet:
		if s.abort != nil {
			return nil
		}
		if v, ok := s.kv[m.Key]; ok {
			c.enqueue(gotFrame(m.ID, v))
		} else if _, dup := c.gets[m.ID]; dup {
			return protoErr("unexpected", "get %d while a get of that id waits", m.ID)
		} else if len(c.gets) >= maxWaitingGets {
			s.refuseLocked(c, "waiting_gets", fmt.Sprintf("the server refused its get of %q: it already had %d gets waiting for keys nobody has put, the most a rank may have",
				cut(m.Key, 64), len(c.gets)))
		} else if c.getBytes+len(m.Key) > maxWaitingGetBytes {
			s.refuseLocked(c, "waiting_get_bytes", fmt.Sprintf("the server refused its get of %q (a key of %d bytes): the keys of its gets waiting for keys nobody has put already totalled %d bytes, and may total at most %d",
				cut(m.Key, 64), len(m.Key), c.getBytes, maxWaitingGetBytes))
		} else {
			if c.gets == nil {
				c.gets = map[uint64]string{}
			}
			c.gets[m.ID] = m.Key
			c.getBytes += len(m.Key)
			s.gets[m.Key] = append(s.gets[m.Key], getter{c, m.ID})
		}
	case *msgCancel:
		// A get answered already, or never made, has nothing to cancel.
		s.dropGetLocked(c, m.ID)
	case *msgAbort:
		s.abortLocked(&AbortError{Rank: c.rank, Reason: m.Reason})
	case *msgLeave:
		c.left = true
		s.dropGetsLocked(c)
		for seq, g := range s.gathers {
			if !g.have[c.rank] && s.abort == nil {
				s.abortLocked(&AbortError{Rank: c.rank, Blamed: true, Reason: fmt.Sprintf("it closed before taking part in collective %d (%s by rank %d)", seq, kindName(g.kind), g.first)})
			}
		}
	default:
		return protoErr("unexpected", "a %v message from a rank", t)
	}
	return nil
}

// dropGetLocked forgets c's get of request id, if it waits.
func (s *Server) dropGetLocked(c *sconn, id uint64) {
	key, ok := c.gets[id]
	if !ok {
		return
	}
	delete(c.gets, id)
	c.getBytes -= len(key)
	gs := slices.DeleteFunc(s.gets[key], func(g getter) bool { return g.c == c && g.id == id })
	if len(gs) == 0 {
		delete(s.gets, key)
	} else {
		s.gets[key] = gs
	}
}

// dropGetsLocked forgets every get of c that waits: the rank left or is
// gone.
func (s *Server) dropGetsLocked(c *sconn) {
	for id := range c.gets {
		s.dropGetLocked(c, id)
	}
}

// gatherLocked adds a rank's part to a collective and, once every rank's
// part is in, sends the result to every rank.
func (s *Server) gatherLocked(c *sconn, m *msgGather) error {
	if m.Seq != c.nextSeq {
		return protoErr("unexpected", "collective %d out of order (expected %d)", m.Seq, c.nextSeq)
	}
	c.nextSeq++
	if s.abort != nil {
		return nil
	}
	if ahead := m.Seq - s.collDone; ahead >= maxCollectivesAhead {
		// Collectives complete in order (every rank enters them in
		// order), so those it entered and not complete are collDone up
		// to m.Seq.
		s.refuseLocked(c, "collectives_ahead", fmt.Sprintf("the server refused its part in collective %d (%s): it had entered %d collectives ahead of the other ranks (collective %d is the first not complete), the most a rank may",
			m.Seq, kindName(m.Kind), ahead, s.collDone))
		return nil
	}
	g := s.gathers[m.Seq]
	if g == nil {
		g = &gather{kind: m.Kind, first: c.rank, recs: make([][]byte, s.size), have: make([]bool, s.size)}
		s.gathers[m.Seq] = g
		for _, o := range s.members {
			if o.left && o.nextSeq <= m.Seq {
				s.abortLocked(&AbortError{Rank: o.rank, Blamed: true, Reason: fmt.Sprintf("it closed before collective %d (%s by rank %d)", m.Seq, kindName(m.Kind), c.rank)})
				return nil
			}
		}
	}
	if g.kind != m.Kind {
		s.abortLocked(&AbortError{Rank: c.rank, Blamed: true, Reason: fmt.Sprintf("collective %d: it called %s where rank %d called %s", m.Seq, kindName(m.Kind), g.first, kindName(g.kind))})
		return nil
	}
	g.recs[c.rank], g.have[c.rank] = m.Rec, true
	g.n++
	g.bytes += 4 + len(m.Rec)
	if g.bytes > MaxGather {
		s.abortLocked(&AbortError{Rank: c.rank, Blamed: true, Reason: fmt.Sprintf("collective %d: the records total more than %d bytes", m.Seq, MaxGather)})
		return nil
	}
	if g.n < s.size {
		return nil
	}
	delete(s.gathers, m.Seq)
	s.collDone = m.Seq + 1
	res := msgGathered{Seq: m.Seq}
	if g.kind == kindAllGather {
		res.Recs = g.recs
	}
	s.broadcastLocked(appendFrame(nil, &res))
	return nil
}

// broadcastLocked queues a frame to every member still connected; the
// frame is shared and must not change.
func (s *Server) broadcastLocked(frame []byte) {
	for _, o := range s.members {
		if o != nil && !o.gone && !o.left {
			o.enqueue(frame, nil)
		}
	}
}

// abortLocked aborts the job once, telling every member.
func (s *Server) abortLocked(a *AbortError) {
	if s.abort != nil {
		return
	}
	s.abort = a
	s.m.aborts.Inc()
	s.log.Error("bootstrap: job aborted", "rank", a.Rank, "lost", a.Lost, "blamed", a.Blamed, "reason", a.Reason)
	s.broadcastLocked(appendFrame(nil, &msgAbort{Rank: int32(a.Rank), Lost: a.Lost, Blamed: a.Blamed, Reason: a.Reason}))
	clear(s.gathers)
	clear(s.gets)
	for _, o := range s.members {
		if o != nil {
			clear(o.gets)
			o.getBytes = 0
		}
	}
	s.finishLocked()
}

// finishLocked ends Serve once every rank has joined and gone, or, after
// an abort, once every rank that joined is gone and every other one was
// refused (it tried to join after the abort).
func (s *Server) finishLocked() {
	if s.done {
		return
	}
	joined := int(s.joined.Load())
	if s.gone == s.size || s.abort != nil && s.gone == joined && joined+len(s.refused) == s.size {
		s.done = true
		close(s.finished)
		if s.ln != nil {
			s.ln.Close()
		}
	}
}

// lost ends a registered rank's connection. Unless it left cleanly or the
// job is over, the job aborts naming the rank.
func (s *Server) lost(c *sconn, log *slog.Logger, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.gone = true
	s.gone++
	s.m.members.Dec()
	s.dropGetsLocked(c)
	bad := errors.Is(err, ErrProtocol)
	if bad {
		s.m.badMessages.WithLabelValues(reasonOf(err)).Inc()
		log.Error("bootstrap: bad message from a rank", "err", err)
	}
	closed := false
	select {
	case <-s.closed:
		closed = true
	default:
	}
	switch {
	case c.left:
		log.Debug("bootstrap: rank left")
	case closed:
	case bad:
		s.abortLocked(&AbortError{Rank: c.rank, Lost: true, Reason: fmt.Sprintf("it sent a bad message: %v", err)})
	case errors.Is(err, io.EOF):
		s.abortLocked(&AbortError{Rank: c.rank, Lost: true, Reason: "its connection ended before it closed its client"})
	default:
		s.abortLocked(&AbortError{Rank: c.rank, Lost: true, Reason: fmt.Sprintf("its connection failed before it closed its client: %v", err)})
	}
	s.finishLocked()
}
