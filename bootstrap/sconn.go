package bootstrap

import (
	"net"
	"sync"
	"time"
)

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

	qmu      sync.Mutex
	q        [][]byte      // frames to write; guarded by qmu
	qshut    bool          // no more frames; guarded by qmu
	kick     chan struct{} // a frame or shut is pending
	shutOnce sync.Once
	wdone    chan struct{} // closed when writeLoop returns, if it ran
	started  bool          // writeLoop was started; guarded by qmu
}

func newSconn(nc net.Conn, m *serverMetrics) *sconn {
	return &sconn{nc: nc, fc: newFrameConn(nc, m.bytesIn, m.bytesOut), remote: nc.RemoteAddr().String(),
		rank: -1, kick: make(chan struct{}, 1), wdone: make(chan struct{})}
}

// enqueue queues a frame; the frame must not change afterwards.
func (c *sconn) enqueue(frame []byte) {
	c.qmu.Lock()
	if !c.qshut {
		c.q = append(c.q, frame)
	}
	c.qmu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

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
	for {
		c.qmu.Lock()
		q, shut := c.q, c.qshut
		c.q = nil
		c.qmu.Unlock()
		for _, f := range q {
			if err := c.fc.write(f); err != nil {
				c.nc.Close()
				return
			}
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
