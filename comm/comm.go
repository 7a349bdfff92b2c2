// Package comm is the API a Go program uses to talk to the other ranks of
// its job, as MPI's: blocking and non-blocking sends and receives with
// tags and wildcards, probes (and matched probes, Mprobe, for goroutines
// that probe at once), communicators made by Dup and Split (and
// released by Free), the collectives (Barrier, Bcast, Gather, Scatter,
// Allgather, Alltoall and the vector forms Gatherv, Scatterv, Allgatherv
// and Alltoallv; Reduce, Allreduce, ReduceScatter, ReduceScatterBlock,
// Scan and Exscan), each also non-blocking (Ibarrier, Iallreduce, …), and
// Abort.
//
// Messages between two ranks on the same communicator with the same tag
// are received in the order they were sent (MPI's non-overtaking rule).
// Small messages go eagerly: copied into the receiver's buffers and
// delivered when they match. Large ones go by rendezvous: the sender
// exposes its buffer and the receiver pulls it once the receive matches,
// with one copy, then tells the sender it is done.
//
// Between ranks of a node the transport is shared memory (transport/shm);
// between nodes it is RC (transport/rc) or XRC (transport/xrc) on the
// rank's verbs device (Config.OpenDevice, XRC_DEVICE), its QPs connected
// at Init or at the first message (XRC_CONNECT).
//
// # Buffers, blocking and contexts
//
// A blocking call (Send, Recv, the collectives) returns once its buffers
// are the caller's again, but for a Send whose context ends first (a
// large message stays offered to its receiver from the buffer: Send)
// and a collective that fails (below). A non-blocking one (Isend, Irecv, Ibarrier,
// Iallreduce, …) returns a Request that owns its buffers until Wait,
// Test, Waitall, Waitany or Testall reports it complete. A Wait whose
// context ends first returns the context's error and leaves the request
// running: its buffers are still the request's, and it can be waited for
// again (a receive that no message has matched can be taken back with
// Cancel). The context of a non-blocking collective, unlike a Wait's,
// bounds the collective itself: if it ends (a deferred cancel of the
// function that started it, say), the collective fails.
//
// # Progress
//
// A rank's messages move while one of its goroutines is in a comm call
// that waits or tests (Recv, Wait, Test, a collective...), or while a
// worker runs one of its non-blocking collectives; there is no
// progress goroutine besides. So a small Isend that found the receiver's
// buffers full goes out only when the sending rank next makes a call
// that waits or tests, or one of its non-blocking collectives' workers
// runs, as with most MPI implementations: a rank that computes for long
// between Isend and Wait should Test now and then.
//
// # Errors
//
// Bad arguments (a rank or root out of range, a negative tag, sizes that
// do not match) are returned as errors, by the point-to-point calls
// before they start. The errors of a call wrap what caused them, so
// that errors.Is matches ErrTruncate, ErrCanceled, ErrFreed, ErrFinalized
// and the context's errors, and errors.As a *TruncateError (which gives
// a truncated message's length) and a *bootstrap.AbortError once the job
// has been aborted.
//
// # Collectives
//
// Every rank of a communicator calls each collective, in the same order
// as the others and with matching sizes and roots, as MPI asks; the
// blocking and non-blocking calls pair up in the order each rank makes
// them. Their messages never match a point-to-point receive. A rank that
// finds a size that does not match returns an error; the ranks that wait
// for it wait until their context ends. Goroutines that run collectives
// at the same time need communicators of their own (Dup). send and recv
// must not overlap, unless a function says so. After a collective fails,
// its buffers may still be read and written by the transports, and the
// job is best ended (Abort).
package comm

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/transport/shm"
	"github.com/xrcrun/xrc/verbs"
)

// Config configures Init. The zero value reads everything from the
// launcher's environment.
type Config struct {
	// Bootstrap and Env are the rank's rendezvous client and what its
	// launcher said, given together; a nil Bootstrap means
	// bootstrap.FromEnv, and Env is then ignored. Finalize closes the
	// client; an Init that fails closes the one it made (not one given).
	Bootstrap *bootstrap.Client
	Env       *bootstrap.Env
	// Dir holds the shared-memory inboxes: XRC_RUNTIME_DIR if set, else
	// /dev/shm, else the temporary directory.
	Dir string
	// EagerLimit is the largest message sent eagerly (XRC_EAGER_LIMIT;
	// default: as much as the transport's frame allows, at most 8 KiB).
	// Negative: only empty messages, as 0 (which XRC_EAGER_LIMIT can say).
	EagerLimit int
	// Spin is how long a waiting rank polls before it sleeps
	// (XRC_SPIN_US; default: a millisecond while the node's ranks have
	// a CPU each, else none). Negative: never poll.
	Spin time.Duration
	// Yield is how long a rank that does not spin polls before it
	// sleeps, giving its CPU to the node's other processes between polls
	// (XRC_YIELD_US; default: 200 µs in a job on one node when Spin is
	// negative, as it is by default when the node's ranks outnumber its
	// CPUs; else none). Negative: never.
	Yield time.Duration
	// NoPull moves large messages between ranks of a node through the
	// shared-memory rings, as when the kernel refuses to let a process
	// read another's memory (XRC_SHM_NOPULL=1).
	NoPull bool
	// Transport is how ranks of other nodes are reached: "rc", "xrc" or
	// "auto" (RC); empty means Env.Transport, else XRC_TRANSPORT,
	// else auto. Connect is "eager" (every QP at Init) or "lazy" (at the
	// first message to a rank); empty means Env.Connect, else XRC_CONNECT,
	// else eager.
	Transport, Connect string
	// OpenDevice opens the rank's verbs device when the job has ranks on
	// other nodes; nil opens the device XRC_DEVICE names (Env.Device),
	// or the first one listed. Finalize closes it.
	OpenDevice func(ctx context.Context, env *bootstrap.Env) (*verbs.Context, error)
	// Registerer, when not nil, gets the transports' counters.
	Registerer prometheus.Registerer
	// Logger gets the rank's log; nil discards it.
	Logger *slog.Logger
}

// Comm is a communicator: a group of ranks and a context of its own, so
// that its messages never match another communicator's. Its methods are
// safe for concurrent use; but collectives that goroutines of a rank call
// on one communicator at once pair up with the other ranks' in the order
// each rank happens to make them, so such goroutines need communicators
// of their own (Dup).
type Comm struct {
	e     *engine
	ctx   uint32 // context id; collBit set for the internal collectives
	rank  int
	size  int
	ranks []int // world rank of each member
	coll  int32 // tag of the next internal collective
	// collComm carries the collectives: c in its collective context.
	// Made at the first, under the engine's lock.
	collComm *Comm
	freed    bool // by Free; under the engine's lock
	jobs     int  // non-blocking collectives running; under the engine's lock
	boot     *bootstrap.Client
}

// collBit marks the context of a communicator's internal collectives.
const collBit = 1 << 31

// Rank is this rank's number in c.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks in c.
func (c *Comm) Size() int { return c.size }

// Init joins the job: it reaches the rendezvous, makes the rank's
// transports, exchanges their records with every rank and returns the
// world communicator.
func Init(ctx context.Context, cfg Config) (*Comm, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	boot, env := cfg.Bootstrap, cfg.Env
	// leave closes the client Init made, if it fails after the join:
	// nobody else can, and the job learns that this rank is gone.
	leave := func(err error) error { return err }
	if boot == nil {
		var err error
		var e bootstrap.Env
		if boot, e, err = bootstrap.FromEnv(ctx, bootstrap.ClientConfig{Logger: cfg.Logger}); err != nil {
			return nil, err
		}
		env = &e
		leave = func(err error) error { return errors.Join(err, boot.Close()) }
	}
	if env == nil {
		return nil, errors.New("comm: Config.Bootstrap without Config.Env")
	}
	jobID := env.JobID
	if jobID == "" {
		jobID = "pid" + strconv.Itoa(os.Getpid())
	}
	if cfg.Dir == "" {
		cfg.Dir = defaultDir()
	}
	if cfg.Spin == 0 {
		cfg.Spin = defaultSpin(env.LocalSize)
		if us, err := strconv.Atoi(os.Getenv("XRC_SPIN_US")); err == nil && us >= 0 {
			cfg.Spin = time.Duration(us) * time.Microsecond
		}
	}
	if cfg.Yield == 0 {
		cfg.Yield = defaultYield(cfg.Spin, env.Nodes)
		if us, err := strconv.Atoi(os.Getenv("XRC_YIELD_US")); err == nil && us >= 0 {
			cfg.Yield = time.Duration(us) * time.Microsecond
		}
	}
	if cfg.EagerLimit == 0 {
		cfg.EagerLimit = 8 << 10
		if n, err := strconv.Atoi(os.Getenv("XRC_EAGER_LIMIT")); err == nil && n >= 0 {
			cfg.EagerLimit = n
		}
	}
	sh, err := shm.New(shm.Config{Dir: cfg.Dir, JobID: jobID, Rank: env.Rank, LocalRank: env.LocalRank, LocalSize: env.LocalSize,
		NoPull: cfg.NoPull || os.Getenv("XRC_SHM_NOPULL") == "1", Logger: cfg.Logger, Registerer: cfg.Registerer})
	if err != nil {
		return nil, leave(err)
	}
	members := boot.Members()
	nodes := make([]int, len(members))
	multi := false
	for i, m := range members {
		nodes[i] = m.Node
		multi = multi || m.Node != members[0].Node
	}
	// Ranks of other nodes: RC or XRC, on the rank's verbs device.
	var (
		rct  transport.Transport
		dev  *verbs.Context
		lazy bool
	)
	fail := func(err error) (*Comm, error) {
		if rct != nil {
			err = errors.Join(err, rct.Close())
		}
		if dev != nil {
			err = errors.Join(err, dev.Close())
		}
		return nil, leave(errors.Join(err, sh.Close()))
	}
	own := [][]byte{sh.Record()}
	if multi {
		f, err := chooseFabric(&cfg, env)
		if err != nil {
			return fail(err)
		}
		lazy = f.lazy
		if dev, err = openDevice(ctx, &cfg, env, f); err != nil {
			return fail(err)
		}
		kick := func() { sh.Bell().Kick() }
		if rct, err = newFabric(&cfg, env, jobID, boot, dev, nodes, f, kick); err != nil {
			return fail(err)
		}
		own = append(own, rct.Record())
	}
	recs, err := boot.AllGather(ctx, joinRecords(own...))
	if err != nil {
		return fail(err)
	}
	peers := make([]transport.Peer, len(members))
	rcPeers := make([]transport.Peer, len(members))
	e := &engine{
		log: cfg.Logger, rank: env.Rank, shm: sh, trs: []transport.Transport{sh}, dev: dev,
		routes: make([]transport.Transport, len(members)), nodes: nodes,
		comms: map[uint32]*Comm{}, posted: map[uint32][]*Request{}, unexpected: map[uint32][]*inMsg{},
		arrived: make(chan struct{}), sends: map[uint64]*Request{}, pulls: map[uint64]*Request{}, pushes: map[pushKey]*pushIn{},
		backlog: map[int][]queued{}, token: make(chan struct{}, 1), spin: cfg.Spin, yield: cfg.Yield,
		work: make(chan *job), finished: make(chan struct{}), handOffDelay: handOffDelay,
	}
	for i, m := range members {
		parts, err := splitRecords(recs[i], len(own))
		if err != nil {
			return fail(fmt.Errorf("rank %d: %w", i, err))
		}
		peers[i] = transport.Peer{Rank: m.Rank, Node: m.Node, LocalRank: m.LocalRank, Record: parts[0]}
		if rct != nil {
			rcPeers[i] = transport.Peer{Rank: m.Rank, Node: m.Node, LocalRank: m.LocalRank, Record: parts[1]}
		}
	}
	if err := sh.Connect(ctx, peers); err != nil {
		return fail(err)
	}
	// The smallest of the node's rings, known once they are connected.
	// An empty message goes eagerly whatever the limit: a rendezvous of
	// no bytes, pushed (a Read refused), has no data frame to finish it.
	e.eagerMax = max(0, min(cfg.EagerLimit, sh.MaxEager()-hdrLen))
	if rct != nil {
		if err := rct.Connect(ctx, rcPeers); err != nil {
			return fail(err)
		}
		// Every QP at RTS before the first frame, so that none is
		// retransmitted for a peer still connecting.
		if !lazy {
			if err := boot.Barrier(ctx); err != nil {
				return fail(err)
			}
		}
		e.trs = append(e.trs, rct)
		e.eagerMax = min(e.eagerMax, rct.MaxEager()-hdrLen)
	}
	for i := range members {
		switch {
		case sh.Reaches(i):
			e.routes[i] = sh
		case rct != nil && rct.Reaches(i):
			e.routes[i] = rct
		}
	}
	e.fatal = func() error {
		select {
		case <-boot.Done():
			if err := boot.Err(); err != nil && !errors.Is(err, bootstrap.ErrClosed) {
				return fmt.Errorf("comm: the job ended: %w", err)
			}
		default:
		}
		return nil
	}
	w := &Comm{e: e, ctx: 0, rank: env.Rank, size: len(members), boot: boot}
	for i := range members {
		w.ranks = append(w.ranks, i)
	}
	e.comms[0] = w
	e.counted = true
	engines.Add(1)
	return w, nil
}

// defaultSpin is how long a rank polls before it sleeps, when nobody
// says: a millisecond while the node's ranks have a CPU each, since a
// sleep and its wake-up cost tens of microseconds here and a rank that
// sleeps makes its partner wait and sleep too; not at all when the ranks
// outnumber the CPUs, since a polling rank then takes the CPU of the one
// it waits for.
func defaultSpin(localSize int) time.Duration {
	if localSize > runtime.NumCPU() {
		return -1
	}
	return time.Millisecond
}

// defaultYield is how long a rank that does not spin (its node's ranks
// outnumber the CPUs) polls before it sleeps, yielding its CPU between
// polls, when nobody says: 200 µs in a job on one node, where the rank it
// waits for is one of the processes it yields to, and a sleep and its
// wake-up cost ten times a hop (a ring of 4 ranks on 2 CPUs, 20,000
// laps: 2.2 µs a hop, against 21 to 24 sleeping); not at all in a job on
// several nodes, whose software HCAs need the CPUs the polling takes.
func defaultYield(spin time.Duration, nodes int) time.Duration {
	if spin < 0 && nodes <= 1 {
		return 200 * time.Microsecond
	}
	return -1
}

func defaultDir() string {
	if d := os.Getenv("XRC_RUNTIME_DIR"); d != "" {
		return d
	}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// Finalize leaves the job: it waits until every rank has called it (so
// that no rank tears down what another still reads), then closes the
// transports and the rendezvous client. Only the world communicator
// finalizes, once. Calls still waiting then, and every later call, fail
// with ErrFinalized.
func (c *Comm) Finalize(ctx context.Context) error {
	if c.ctx != 0 {
		return errors.New("comm: Finalize on a communicator other than the world")
	}
	// The others may still need this rank until they call Finalize too:
	// for frames still queued here for ranks whose buffers were full, or
	// in their own queues for this one, or to answer the connection of a
	// rank that sends lazily. So the rank progresses while it waits for
	// them (or another of its goroutines does).
	e := c.e
	e.mu.Lock()
	if e.finalizing {
		e.mu.Unlock()
		return ErrFinalized
	}
	e.finalizing = true
	if e.handOffTimer != nil {
		e.handOffTimer.Stop()
	}
	e.mu.Unlock()
	var err, berr error
	bdone := make(chan struct{})
	go func() {
		berr = c.boot.Barrier(ctx)
		close(bdone)
		e.kick()
	}()
	arrived := func() bool {
		select {
		case <-bdone:
			return true
		default:
			return false
		}
	}
	if aerr := e.await(ctx, arrived, func() []<-chan struct{} { return []<-chan struct{}{bdone} }); aerr != nil {
		err = errors.Join(err, aerr)
	}
	<-bdone
	err = errors.Join(err, berr)
	// From here every call fails with ErrFinalized. The goroutine that
	// drives progress, perhaps asleep on the bell, sees it at its next
	// look; once it has given the token back, nothing reads the
	// transports' memory, and they close.
	e.mu.Lock()
	e.closed = true
	close(e.finished) // idle workers end
	e.shm.Bell().Kick()
	e.mu.Unlock()
	e.token <- struct{}{}
	e.mu.Lock()
	// In reverse: shm's bell, which the others kick, goes last.
	for _, tr := range slices.Backward(e.trs) {
		err = errors.Join(err, tr.Close())
	}
	if e.dev != nil {
		err = errors.Join(err, e.dev.Close())
	}
	if e.counted {
		e.counted = false
		engines.Add(-1)
	}
	e.failPending(ErrFinalized, true)
	e.mu.Unlock()
	<-e.token
	return errors.Join(err, c.boot.Close())
}

// Abort ends the job: every rank's pending and later calls fail, and the
// launcher stops the ranks. This process exits with code, after the
// rendezvous server has spread the abort, or when ctx ends, or after
// abortWait at most: the process's end, which the server and the
// launcher see, ends the job too.
func (c *Comm) Abort(ctx context.Context, code int, reason string) {
	c.abortJob(ctx, code, reason)
	os.Exit(code)
}

// abortWait bounds how long Abort waits for the rendezvous server: a
// server that does not answer (stalled, or not reading this rank's
// requests) must not keep an aborting process alive.
var abortWait = 10 * time.Second

// abortJob is Abort without its exit.
func (c *Comm) abortJob(ctx context.Context, code int, reason string) error {
	ctx, cancel := context.WithTimeout(ctx, abortWait)
	defer cancel()
	return c.boot.Abort(ctx, fmt.Sprintf("rank %d: %s (code %d)", c.ranks[c.rank], reason, code))
}

func (c *Comm) checkPeer(r int, what string) error {
	if r < 0 || r >= c.size {
		return fmt.Errorf("comm: %s rank %d of a communicator of %d", what, r, c.size)
	}
	return nil
}

func checkTag(tag int, wild bool) error {
	if tag < 0 && !(wild && tag == AnyTag) || tag > 1<<31-1 {
		return fmt.Errorf("comm: tag %d", tag)
	}
	return nil
}

// Isend starts sending buf to rank dst of c with tag. The request owns
// buf until it completes: a small message completes when it is copied
// into the receiver's buffers (at once, unless they are full), a large one
// when the receiver has pulled it.
func (c *Comm) Isend(buf []byte, dst, tag int) (*Request, error) {
	return c.isend(newRequest(c.e), buf, dst, tag)
}

func (c *Comm) isend(r *Request, buf []byte, dst, tag int) (*Request, error) {
	if err := errors.Join(c.checkPeer(dst, "send to"), checkTag(tag, false)); err != nil {
		return nil, err
	}
	e := c.e
	world := c.ranks[dst]
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := c.usable(); err != nil {
		return nil, err
	}
	tr, err := e.route(world)
	if err != nil {
		return nil, err
	}
	r.c = c
	h := header{ctx: c.ctx, src: int32(c.rank), tag: int32(tag), length: uint64(len(buf))}
	hb := &e.hdr // the lock is held; send copies it
	if len(buf) <= e.eagerMax {
		h.kind = kindEager
		h.put(hb[:])
		r.st = Status{Source: c.rank, Tag: tag, Count: len(buf)}
		sent, err := e.send(tr, world, r, hb[:], buf)
		if err != nil {
			return nil, err
		}
		if sent {
			r.complete(r.st, nil)
		}
		return r, nil
	}
	remote, err := tr.Expose(buf)
	if err != nil {
		return nil, err
	}
	e.nextID++
	h.kind, h.id = kindRTS, e.nextID
	h.put(hb[:])
	r.tr, r.remote, r.sbuf, r.rdvWorld, r.st = tr, remote, buf, world, Status{Source: c.rank, Tag: tag, Count: len(buf)}
	e.sends[h.id] = r
	if _, err := e.send(tr, world, nil, hb[:], remote); err != nil {
		delete(e.sends, h.id)
		tr.Unexpose(remote)
		return nil, err
	}
	return r, nil
}

// Irecv starts receiving into buf a message from rank src of c (or
// AnySource) with tag (or AnyTag). The request owns buf until it
// completes.
func (c *Comm) Irecv(buf []byte, src, tag int) (*Request, error) {
	return c.irecv(newRequest(c.e), buf, src, tag)
}

// checkMatch checks the source and tag a receive or probe matches, either
// of them a wildcard or not.
func (c *Comm) checkMatch(src, tag int, what string) error {
	if src != AnySource {
		if err := c.checkPeer(src, what); err != nil {
			return err
		}
	}
	return checkTag(tag, true)
}

func (c *Comm) irecv(r *Request, buf []byte, src, tag int) (*Request, error) {
	if err := c.checkMatch(src, tag, "receive from"); err != nil {
		return nil, err
	}
	e := c.e
	r.c, r.buf, r.src, r.tag = c, buf, src, tag
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := c.usable(); err != nil {
		return nil, err
	}
	if m := e.takeUnexpected(c, r); m != nil {
		e.deliverTo(r, m, nil)
		return r, nil
	}
	if err := c.sourceFailed(src); err != nil {
		return nil, err
	}
	e.posted[c.ctx] = append(e.posted[c.ctx], r)
	return r, nil
}

// Send sends buf to rank dst of c with tag and returns when buf may be
// reused. If ctx ends first, Send returns its error, but the message
// still goes: a small one waiting for room in the receiver's buffers was
// copied, and goes when there is room; a message too large to go eagerly
// stays offered to the receiver, which may still take it from buf. A
// send cannot be taken back.
func (c *Comm) Send(ctx context.Context, buf []byte, dst, tag int) error {
	r, err := c.isend(pooledRequest(c.e), buf, dst, tag)
	if err != nil {
		return err
	}
	_, err = r.Wait(ctx)
	r.release()
	return err
}

// Recv receives into buf a message from src (or AnySource) with tag (or
// AnyTag). A message longer than buf fills it and returns ErrTruncate.
// If ctx ends before a message matches, Recv takes the receive back and
// returns ctx's error: buf is the caller's again, and the message goes to
// a later receive. One that has matched is received, whatever ctx.
func (c *Comm) Recv(ctx context.Context, buf []byte, src, tag int) (Status, error) {
	r, err := c.irecv(pooledRequest(c.e), buf, src, tag)
	if err != nil {
		return Status{}, err
	}
	st, err := waitRecv(ctx, r)
	r.release()
	return st, err
}

// Sendrecv sends to dst and receives from src at once, so that two ranks
// can exchange without ordering their calls.
//
// The receive is as Recv's: if ctx ends before a message matches it, it is
// taken back, and one that has matched is received whatever ctx. The send
// is as Send's.
func (c *Comm) Sendrecv(ctx context.Context, sbuf []byte, dst, stag int, rbuf []byte, src, rtag int) (Status, error) {
	// Both halves' arguments are checked before either starts: a receive
	// that has matched cannot be taken back.
	if err := errors.Join(c.checkPeer(dst, "send to"), checkTag(stag, false), c.checkMatch(src, rtag, "receive from")); err != nil {
		return Status{}, err
	}
	rr, err := c.irecv(pooledRequest(c.e), rbuf, src, rtag)
	if err != nil {
		return Status{}, err
	}
	defer rr.release()
	sr, serr := c.isend(pooledRequest(c.e), sbuf, dst, stag)
	if serr != nil {
		if rr.Cancel() {
			return Status{}, serr
		}
		st, rerr := waitRecv(ctx, rr)
		return st, errors.Join(serr, rerr)
	}
	defer sr.release()
	st, rerr := waitRecv(ctx, rr)
	if !rr.isDone() || rr.err == ErrCanceled {
		return Status{}, rerr // the job ended, or ctx before a message matched
	}
	_, serr = sr.Wait(ctx)
	return st, errors.Join(rerr, serr)
}

// Iprobe reports whether a message from src with tag waits to be
// received, and its status, without receiving it.
func (c *Comm) Iprobe(src, tag int) (bool, Status, error) {
	c.e.progressOnce()
	return c.peek(src, tag)
}

func (c *Comm) peek(src, tag int) (bool, Status, error) {
	m, err := c.probe(src, tag, false)
	if m == nil || err != nil {
		return false, Status{}, err
	}
	return true, m.status(), nil
}

// probe finds the first message come before its receive that matches src
// and tag, if there is one; with take, it removes it from the matching.
func (c *Comm) probe(src, tag int, take bool) (*inMsg, error) {
	if err := c.checkMatch(src, tag, "probe"); err != nil {
		return nil, err
	}
	r := &Request{src: src, tag: tag}
	e := c.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := c.usable(); err != nil {
		return nil, err
	}
	if take {
		if m := e.takeUnexpected(c, r); m != nil {
			return m, nil
		}
	} else {
		for _, m := range e.unexpected[c.ctx] {
			if c.matches(r, m) {
				return m, nil
			}
		}
	}
	if err := c.sourceFailed(src); err != nil {
		return nil, err // nothing more will come from it
	}
	return nil, nil
}

// Probe waits until a message from src with tag can be received and
// returns its status, without receiving it.
func (c *Comm) Probe(ctx context.Context, src, tag int) (Status, error) {
	var st Status
	var err error
	ok := false
	if werr := c.e.await(ctx, func() bool {
		ok, st, err = c.peek(src, tag)
		return ok || err != nil
	}, func() []<-chan struct{} { return []<-chan struct{}{c.e.arrived} }); werr != nil {
		return Status{}, werr
	}
	return st, err
}

// Dup returns a communicator with the same ranks and a context of its own.
// Every rank of c calls it, in the same order as c's other collectives.
func (c *Comm) Dup(ctx context.Context) (*Comm, error) {
	return c.Split(ctx, 0, c.rank)
}

// Undefined is the color of a rank that wants no communicator from Split.
const Undefined = -1

// Split partitions c: the ranks that pass the same color form a new
// communicator, ranked by key and then by their rank in c. A color is
// non-negative, or Undefined: a rank that passes Undefined gets nil (and
// one that passes another negative color nil and an error). Every rank of
// c calls it.
func (c *Comm) Split(ctx context.Context, color, key int) (*Comm, error) {
	var bad error
	if color < Undefined {
		// Taken as Undefined by the others, so that the calls still
		// pair up.
		bad, color = fmt.Errorf("comm: split color %d", color), Undefined
	}
	var rec [splitRecLen]byte
	binary.LittleEndian.PutUint64(rec[:], uint64(int64(color)))
	binary.LittleEndian.PutUint64(rec[8:], uint64(int64(key)))
	all := make([]byte, len(rec)*c.size)
	// The new context derives from the collective's tag: the ranks agree
	// on it, as the calls pair up by it, in whatever order concurrent
	// Splits of c end.
	var n *Comm
	if err := c.run(func(cc *Comm, tag int) error {
		if err := cc.allgather(ctx, tag, rec[:], all); err != nil {
			return err
		}
		n = c.splitMembers(color, all)
		return c.agreeContext(ctx, cc, tag, n, color)
	}); err != nil {
		return nil, err
	}
	if n == nil {
		return nil, bad
	}
	return n, nil
}

// splitContext is the candidate context id, number salt, of the
// communicator of color made by the Split of tag on a communicator of
// context parent.
func splitContext(parent uint32, tag, color int, salt int64) uint32 {
	h := fnv.New32a()
	binary.Write(h, binary.LittleEndian, [4]int64{int64(parent), int64(tag), int64(color), salt})
	if id := h.Sum32() &^ collBit; id != 0 {
		return id
	}
	return 1
}

// splitRecLen is the size of a rank's record in Split: color and key.
const splitRecLen = 16

// splitMembers makes this rank's communicator of Split (nil for
// Undefined), all but its context, from the ranks' colors and keys.
func (c *Comm) splitMembers(color int, all []byte) *Comm {
	if color == Undefined {
		return nil
	}
	type member struct{ key, rank int }
	var ms []member
	for r := range c.size {
		b := all[r*splitRecLen:]
		if int(int64(binary.LittleEndian.Uint64(b))) == color {
			ms = append(ms, member{int(int64(binary.LittleEndian.Uint64(b[8:]))), r})
		}
	}
	slices.SortStableFunc(ms, func(a, b member) int {
		return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.rank, b.rank))
	})
	n := &Comm{e: c.e, boot: c.boot, size: len(ms)}
	for i, m := range ms {
		if m.rank == c.rank {
			n.rank = i
		}
		n.ranks = append(n.ranks, c.ranks[m.rank])
	}
	return n
}

// agreeContext gives n, the new communicator of this rank's color (nil for
// Undefined), a context id free on every rank of c: the ranks of a color
// derive the same candidate from c's context, the Split's tag (its place
// among c's collectives, on which the ranks agree) and the color; each
// takes it if it is free here, and they all learn, within the Split's
// collective call (cc, tag), whether every rank could. If one could not
// (another communicator of its has the id), every rank lets its candidate
// go and they try the next one. So the ranks of a color succeed or fail
// together, where a rank that found its id taken used to fail alone and
// leave the others waiting in the new communicator.
func (c *Comm) agreeContext(ctx context.Context, cc *Comm, tag int, n *Comm, color int) error {
	for salt := int64(0); ; salt++ {
		free := byte(1)
		if n != nil {
			n.ctx = splitContext(c.ctx, tag, color, salt)
			c.e.mu.Lock()
			if old, ok := c.e.comms[n.ctx]; ok && old != nil {
				free = 0
			} else {
				c.e.comms[n.ctx] = n
			}
			c.e.mu.Unlock()
		}
		all := make([]byte, c.size)
		err := cc.allgather(ctx, tag, []byte{free}, all)
		if err == nil && !slices.Contains(all, 0) {
			return nil
		}
		if n != nil && free == 1 {
			c.e.mu.Lock()
			delete(c.e.comms, n.ctx)
			c.e.mu.Unlock()
		}
		if err != nil {
			return err
		}
	}
}

// usable returns the error of a call on c, if c can take none: its rank
// has finalized, the job has ended (an abort, a lost server), or c was
// freed. The engine's lock is held.
func (c *Comm) usable() error {
	switch {
	case c.e.closed:
		return ErrFinalized
	case c.freed:
		return ErrFreed
	}
	return c.e.fatal()
}

// Free releases c, a communicator made by Dup or Split: the rank forgets
// it, and later calls on c fail with ErrFreed. Each rank of c frees it
// once the calls it made on c have completed and the messages sent to it
// on c have been received, as MPI_Comm_free asks; while receives are
// still posted on c, messages wait there unreceived, large sends on c
// wait for their receivers or non-blocking collectives on c run, Free
// frees nothing and says so. Messages of c's collectives that this rank
// never took (its part failed or was cancelled) are dropped, their large
// senders released. A message Mprobe took may still be
// received. The world
// cannot be freed (Finalize ends it).
func (c *Comm) Free() error {
	if c.ctx == 0 {
		return errors.New("comm: the world communicator cannot be freed")
	}
	e := c.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := c.usable(); err != nil {
		return err
	}
	if c.jobs > 0 {
		return fmt.Errorf("comm: free: %d non-blocking collectives on the communicator still running", c.jobs)
	}
	ctxs := []uint32{c.ctx, c.ctx | collBit}
	for _, ctx := range ctxs {
		if n := len(e.posted[ctx]); n > 0 {
			return fmt.Errorf("comm: free: %d receives still posted on the communicator", n)
		}
	}
	if n := len(e.unexpected[c.ctx]); n > 0 {
		return fmt.Errorf("comm: free: %d messages on the communicator not received", n)
	}
	for _, r := range e.sends {
		if r.c == c || r.c != nil && r.c == c.collComm {
			return errors.New("comm: free: a send on the communicator waits for its receiver")
		}
	}
	e.dropCollective(c)
	for _, ctx := range ctxs {
		delete(e.posted, ctx)
		delete(e.unexpected, ctx)
	}
	delete(e.comms, c.ctx)
	c.freed = true
	if c.collComm != nil {
		c.collComm.freed = true
	}
	return nil
}

// SplitByNode returns the communicator of the ranks of c on this rank's
// node, ranked as in c.
func (c *Comm) SplitByNode(ctx context.Context) (*Comm, error) {
	return c.Split(ctx, c.e.nodes[c.ranks[c.rank]], c.rank)
}
