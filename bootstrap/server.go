package bootstrap

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ServerConfig configures a rendezvous server.
type ServerConfig struct {
	Size       int                   // ranks expected
	Key        []byte                // the job's random key (at least 16 bytes); the server keeps a copy
	Logger     *slog.Logger          // nil: discard
	Registerer prometheus.Registerer // nil: none

	// HandshakeTimeout bounds a connection's handshake and registration
	// (zero: 30 s). After it, a registered rank may stay idle for as long
	// as the job runs.
	HandshakeTimeout time.Duration
}

// Server is the rendezvous of one job: the ranks register with it, and it
// answers their all-gathers, barriers, puts and gets, and broadcasts an
// abort. A rank whose connection ends before it closed its client aborts
// the job, as a process exiting without MPI_Finalize aborts an MPI job.
// The methods are safe for concurrent use.
type Server struct {
	size    int
	key     []byte
	timeout time.Duration
	ln      net.Listener
	log     *slog.Logger
	m       *serverMetrics
	rand    io.Reader // the nonces' source
	joined  atomic.Int32

	closeOnce sync.Once
	closed    chan struct{} // closed by Close
	finished  chan struct{} // closed once every rank has joined and gone (finishLocked)
	done      bool          // finished is closed; guarded by mu
	// refused holds the ranks refused after an abort that had not joined
	// before it; guarded by mu.
	refused map[int]bool
	wg      sync.WaitGroup

	mu         sync.Mutex
	conns      map[*sconn]struct{} // open connections, registered or not
	handshakes int                 // connections in their handshake
	members    []*sconn            // by rank; nil until registered
	gone       int                 // members whose connection ended
	abort      *AbortError         // set once the job is aborted
	gathers    map[uint64]*gather  // collectives under way, by number
	collDone   uint64              // collectives complete: every one numbered below it
	kv         map[string][]byte   // values put
	gets       map[string][]getter // gets waiting for their key
}

// gather is a collective under way; guarded by Server.mu.
type gather struct {
	kind  uint8
	first int      // the rank that started it
	recs  [][]byte // by rank; aliases the frames received
	have  []bool
	n     int
	bytes int
}

type getter struct {
	c  *sconn
	id uint64
}

// Listen opens the server's socket on addr (such as "127.0.0.1:0" or
// ":0"); Serve then serves it.
func Listen(ctx context.Context, addr string, cfg ServerConfig) (*Server, error) {
	if cfg.Size < 1 || cfg.Size > 1<<24 {
		return nil, fmt.Errorf("bootstrap: listen: job size %d out of range", cfg.Size)
	}
	if len(cfg.Key) < 16 {
		return nil, fmt.Errorf("bootstrap: listen: the job key must be at least 16 bytes, not %d", len(cfg.Key))
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: listen: %w", err)
	}
	s := newServer(cfg, ln)
	s.log = s.log.With("addr", s.Addr())
	return s, nil
}

// maxHandshakes bounds the connections in their handshake at once; more
// are refused, so that a flood of idle connections cannot exhaust the
// server before its handshake deadline closes them.
const maxHandshakes = 1024

// newServer makes a server of ln (nil in fuzz tests, which feed
// connections to serveConn themselves).
func newServer(cfg ServerConfig, ln net.Listener) *Server {
	s := &Server{
		size: cfg.Size, key: append([]byte(nil), cfg.Key...), timeout: cfg.HandshakeTimeout,
		ln: ln, log: discard(cfg.Logger), m: newServerMetrics(cfg.Registerer), rand: rand.Reader,
		closed: make(chan struct{}), finished: make(chan struct{}),
		conns: map[*sconn]struct{}{}, members: make([]*sconn, cfg.Size),
		gathers: map[uint64]*gather{}, kv: map[string][]byte{}, gets: map[string][]getter{},
	}
	if s.timeout <= 0 {
		s.timeout = 30 * time.Second
	}
	return s
}

// Addr returns the host:port ranks dial.
func (s *Server) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Joined returns the number of ranks registered so far.
func (s *Server) Joined() int { return int(s.joined.Load()) }

// Serve accepts and serves ranks until ctx is done, Close is called, or
// every rank has joined and gone. It returns nil after ctx or Close and
// when every rank left cleanly (closed its client); if the job was
// aborted it returns the *AbortError once every rank is gone: those that
// joined, and those refused because they came after the abort.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	backoff := 5 * time.Millisecond
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.closed:
				return nil
			case <-s.finished:
				s.Close() // connections still in their handshake
				s.mu.Lock()
				defer s.mu.Unlock()
				if s.abort != nil {
					return s.abort
				}
				return nil
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if acceptRetry(err) {
				// Out of descriptors or buffers, perhaps for a moment:
				// the ranks already in must not lose their server.
				s.m.acceptErrors.Inc()
				s.log.Warn("bootstrap: accept failed; retrying", "err", err, "in", backoff)
				select {
				case <-time.After(backoff):
				case <-s.closed:
				}
				backoff = min(2*backoff, time.Second)
				continue
			}
			s.Close()
			return fmt.Errorf("bootstrap: accept: %w", err)
		}
		backoff = 5 * time.Millisecond
		c := newSconn(nc, s.m)
		s.mu.Lock()
		select {
		case <-s.closed:
			s.mu.Unlock()
			nc.Close()
			continue
		default:
		}
		if s.handshakes >= maxHandshakes {
			s.mu.Unlock()
			s.m.refused.Inc()
			s.log.Warn("bootstrap: too many connections in their handshake; refusing one", "remote", c.remote)
			nc.Close()
			continue
		}
		s.handshakes++
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

// Abort aborts the job: every member's client ends with an *AbortError
// (Rank -1) carrying reason. Ranks that register later are refused.
func (s *Server) Abort(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.abortLocked(&AbortError{Rank: -1, Reason: cut(reason, maxReason)})
}

// Close stops the server: it closes the socket and every connection (after
// a short flush of what was queued for them, such as an abort) and waits
// for its goroutines. Ranks still connected see ErrLost.
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.mu.Lock()
		close(s.closed)
		s.mu.Unlock()
		err = s.ln.Close()
		if errors.Is(err, net.ErrClosed) {
			err = nil
		}
		s.mu.Lock()
		var wg sync.WaitGroup
		for c := range s.conns {
			wg.Go(func() { c.shut(time.Second) })
		}
		s.mu.Unlock()
		wg.Wait()
	})
	s.wg.Wait()
	return err
}

// serveConn runs one connection: the handshake, registration, then the
// rank's requests until the connection ends.
func (s *Server) serveConn(c *sconn) {
	defer s.wg.Done()
	nc := c.nc
	log := s.log.With("remote", c.remote)
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.shut(time.Second)
	}()

	nc.SetDeadline(time.Now().Add(s.timeout))
	reg, err := acceptHandshake(c.fc, s.key, s.rand)
	s.mu.Lock()
	s.handshakes--
	s.mu.Unlock()
	if err != nil {
		s.noteHandshakeError(log, err)
		return
	}
	if err := s.register(c, reg); err != nil {
		log.Warn("bootstrap: registration refused", "rank", reg.Rank, "err", err)
		return
	}
	nc.SetDeadline(time.Time{})
	log = log.With("rank", c.rank)
	log.Debug("bootstrap: rank registered", "node", reg.Node, "local_rank", reg.LocalRank)
	c.startWriter()

	paused := func(queued int) {
		s.m.readPauses.Inc()
		log.Debug("bootstrap: rank reads slowly; its requests wait", "queued", queued, "bound", maxQueued)
	}
	for {
		c.waitQueue(paused)
		t, p, err := c.fc.read(maxFromRank)
		if err == nil {
			err = s.handle(c, t, p)
		}
		if err != nil {
			s.lost(c, log, err)
			return
		}
	}
}

// noteHandshakeError counts and logs a connection that did not get
// through the handshake.
func (s *Server) noteHandshakeError(log *slog.Logger, err error) {
	switch {
	case errors.Is(err, ErrAuth):
		s.m.authFailures.Inc()
		log.Warn("bootstrap: authentication failed", "err", err)
	case errors.Is(err, ErrProtocol):
		s.m.badMessages.WithLabelValues(reasonOf(err)).Inc()
		log.Warn("bootstrap: bad message in the handshake", "err", err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.m.badMessages.WithLabelValues("timeout").Inc()
		log.Warn("bootstrap: handshake timed out", "err", err)
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		log.Debug("bootstrap: connection closed in the handshake", "err", err)
	default:
		log.Warn("bootstrap: handshake failed", "err", err)
	}
}

// register admits the rank or tells it why not.
func (s *Server) register(c *sconn, r *msgRegister) error {
	var rej *msgReject
	refused := -1 // a rank of the job refused after the abort
	defer func() {
		if rej != nil { // sent outside the lock
			c.fc.send(rej)
		}
		if refused >= 0 {
			// Counted once its refusal is on its way: the last rank
			// refused ends the job, and Close would cut a reject not
			// yet sent, leaving the rank with an EOF for the reason.
			s.mu.Lock()
			if s.refused == nil {
				s.refused = map[int]bool{}
			}
			s.refused[refused] = true
			s.finishLocked()
			s.mu.Unlock()
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	reject := func(code uint8, format string, args ...any) error {
		text := fmt.Sprintf(format, args...)
		s.m.rejected.Inc()
		rej = &msgReject{Code: code, Text: cut(text, maxReason)}
		return fmt.Errorf("%w: %s", ErrRejected, text)
	}
	rank := int(r.Rank)
	switch {
	case s.abort != nil:
		if rank >= 0 && rank < s.size && s.members[rank] == nil && int(r.Size) == s.size {
			refused = rank
		}
		return reject(rejectAborted, "%s", strings.TrimPrefix(s.abort.Error(), "bootstrap: "))
	case int(r.Size) != s.size:
		return reject(rejectRegister, "rank %d says the job has %d ranks; it has %d", rank, r.Size, s.size)
	case rank >= s.size:
		return reject(rejectRegister, "rank %d is out of range for a job of %d ranks", rank, s.size)
	case s.members[rank] != nil:
		return reject(rejectRegister, "rank %d is already registered (from %s)", rank, s.members[rank].remote)
	}
	c.rank = rank
	c.member = Member{Rank: rank, Node: int(r.Node), LocalRank: int(r.LocalRank), Endpoint: r.Endpoint}
	s.members[rank] = c
	s.m.joins.Inc()
	s.m.members.Inc()
	if int(s.joined.Add(1)) == s.size {
		ready := msgReady{Members: make([]Member, s.size)}
		total := 0
		for i, m := range s.members {
			ready.Members[i] = m.member
			total += 16 + len(m.member.Endpoint)
		}
		if total > MaxGather {
			s.abortLocked(&AbortError{Rank: -1, Reason: fmt.Sprintf("the endpoints total %d bytes, more than %d", total, MaxGather)})
			return nil
		}
		s.broadcastLocked(appendFrame(nil, &ready))
		s.log.Info("bootstrap: every rank joined", "size", s.size)
	}
	return nil
}

// acceptRetry reports whether an accept error may pass: the process or
// system is out of descriptors or buffers, or a connection was aborted
// before it was taken.
func acceptRetry(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ECONNABORTED)
}
