package bootstrap

import (
	"net"
	"sync"
	"time"
)

// maxQueued is the backpressure bound of a rank's connection: while more
// than this many bytes are queued for the rank and not yet written to its
// socket, the server reads no more of the rank's requests (waitQueue). A
// rank that sends requests and never reads their answers then blocks
// itself on TCP once its socket's buffers fill, and its answers cost the
// server at most maxQueued bytes plus the answer to its last request read,
// instead of memory without bound. (An answer carrying a value shares the
// value's bytes with the key-value store, gotFrame, so it costs memory
// only for its header, though its bytes count against the bound.)
//
// It is a bound on reading, not a limit on frames: a frame larger than it,
// such as an all-gather result or member table of thousands of ranks (up
// to MaxGather), is queued and sent whole, and only delays the rank's next
// request until the rank has read all but maxQueued bytes of it. A healthy
// client reads all the time (Client.readLoop), so it only ever waits for
// its own reading. 4 MiB is far above what a rank's own pipelined requests
// need (a put's or a get's answer of a small record is tens of bytes) and
// about what loopback and LAN sockets buffer, so a slow but healthy rank
// rarely waits at all.
//
// Frames the server sends a rank whatever it asked (the member table,
// collective results, the answers to its gets waiting for a key another
// rank puts, an abort) are queued regardless of the bound: dropping them
// would lose a healthy rank's answers, and refusing them would fail a
// rank that is only slow. Each answers something the server read from the
// rank while it was under the bound (its part in the collective, its get)
// or is the last (the abort); they cost memory once, however many ranks
// they are queued for: a collective's result is one frame shared by every
// rank's queue, and a value's answers share its bytes. (What a rank's
// requests themselves make the server hold, its gets waiting for keys
// nobody has put and its parts in collectives the others have not
// entered, is bounded apart, by maxWaitingGets, maxWaitingGetBytes and
// maxCollectivesAhead in job.go: a request past those aborts the job
// naming the rank.)
const maxQueued = 4 << 20

// sconn is the server's side of one rank's connection. Frames to the rank
// go through a queue and a writer goroutine, so that the server never
// blocks on a slow rank while it holds its lock.
type sconn struct {
	nc     net.Conn
	fc     *frameConn
	remote string

	// Guarded by Server.mu; set at registration.
	rank    int
	member  Member
	nextSeq uint64            // the number of the rank's next collective
	left    bool              // the rank said leave
	gone    bool              // the connection ended
	gets    map[uint64]string // the rank's gets waiting for their keys, by request id
	// getBytes is the bytes of the keys of gets (maxWaitingGetBytes).
	getBytes int

	qmu      sync.Mutex
	q        []qframe      // frames to write; guarded by qmu
	qbytes   int           // bytes queued and not yet written; guarded by qmu
	qpeak    int           // the most qbytes has been; guarded by qmu
	qcond    *sync.Cond    // on qmu: qbytes fell to maxQueued, shut, or the writer ended
	wended   bool          // writeLoop returned; guarded by qmu
	qshut    bool          // no more frames; guarded by qmu
	kick     chan struct{} // a frame or shut is pending
	shutOnce sync.Once
	wdone    chan struct{} // closed when writeLoop returns, if it ran
	started  bool          // writeLoop was started; guarded by qmu
}

func newSconn(nc net.Conn, m *serverMetrics) *sconn {
	c := &sconn{nc: nc, fc: newFrameConn(nc, m.bytesIn, m.bytesOut), remote: nc.RemoteAddr().String(),
		rank: -1, kick: make(chan struct{}, 1), wdone: make(chan struct{})}
	c.qcond = sync.NewCond(&c.qmu)
	return c
}

// enqueue queues a frame, given as the frame and nothing more, or as two
// parts written one after the other (gotFrame's, whose value is shared by
// the answers to every get of it); neither may change afterwards.
func (c *sconn) enqueue(frame, rest []byte) {
	c.qmu.Lock()
	if !c.qshut && !c.wended {
		c.q = append(c.q, qframe{frame, rest})
		c.qbytes += len(frame) + len(rest)
		c.qpeak = max(c.qpeak, c.qbytes)
	}
	c.qmu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// qframe is a queued frame: its bytes are a then b.
type qframe struct{ a, b []byte }

// startWriter starts the goroutine that writes queued frames.
func (c *sconn) startWriter() {
	c.qmu.Lock()
	c.started = true
	c.qmu.Unlock()
	go c.writeLoop()
}

// writeLoop writes queued frames until shut.
func (c *sconn) writeLoop() {
	defer close(c.wdone)
	defer func() {
		c.qmu.Lock()
		c.wended = true
		c.qcond.Broadcast()
		c.qmu.Unlock()
	}()
	for {
		c.qmu.Lock()
		q, shut := c.q, c.qshut
		c.q = nil
		c.qmu.Unlock()
		for _, f := range q {
			err := c.fc.write(f.a)
			if err == nil && len(f.b) > 0 {
				err = c.fc.write(f.b)
			}
			if err != nil {
				// The connection is broken; its reader finds out from
				// the socket, after what the rank sent before, its leave
				// perhaps. Closing the connection here would cut that.
				return
			}
			c.qmu.Lock()
			c.qbytes -= len(f.a) + len(f.b)
			if c.qbytes <= maxQueued {
				c.qcond.Broadcast()
			}
			c.qmu.Unlock()
		}
		if shut {
			return
		}
		<-c.kick
	}
}

// shut flushes what is queued, for at most grace, and closes the
// connection. It may be called more than once and from any goroutine.
func (c *sconn) shut(grace time.Duration) {
	c.shutOnce.Do(func() {
		c.qmu.Lock()
		c.qshut = true
		started := c.started
		c.qcond.Broadcast()
		c.qmu.Unlock()
		select {
		case c.kick <- struct{}{}:
		default:
		}
		if started {
			c.nc.SetWriteDeadline(time.Now().Add(grace))
			<-c.wdone
		}
		c.nc.Close()
	})
}

// waitQueue returns once at most maxQueued bytes are queued for the rank,
// or the connection is shut or its writer has ended (the connection is
// broken: a read then fails, once the rank's last requests are read). If it has to wait it first calls paused, outside
// the lock, with the bytes queued. The connection's reader calls it
// before each request it reads: this is the server's backpressure.
func (c *sconn) waitQueue(paused func(queued int)) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	full := func() bool { return c.qbytes > maxQueued && !c.qshut && !c.wended }
	if !full() {
		return
	}
	q := c.qbytes
	c.qmu.Unlock()
	paused(q)
	c.qmu.Lock()
	for full() {
		c.qcond.Wait()
	}
}

// queued returns the bytes queued for the rank and not yet written, and
// the most there have been.
func (c *sconn) queued() (now, peak int) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	return c.qbytes, c.qpeak
}
