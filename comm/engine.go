package comm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	xunix "github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/transport/shm"
	"github.com/xrcrun/xrc/verbs"
)

// engine is a process's progress engine: its transports, the matching
// queues of every communicator, and the rendezvous in flight. One lock
// guards it all; one goroutine at a time (the holder of the progress
// token) drives the transports and sleeps on the rank's bell when nothing
// happens, while other waiting goroutines wait for their requests or for
// the token.
type engine struct {
	mu     sync.Mutex
	log    *slog.Logger
	rank   int // world rank
	shm    *shm.Transport
	dev    *verbs.Context        // the verbs device of the RC transport, closed by Finalize; nil if none
	trs    []transport.Transport // distinct transports, for progress
	routes []transport.Transport // by world rank; nil: unreachable
	nodes  []int                 // node of each world rank

	comms      map[uint32]*Comm
	posted     map[uint32][]*Request // receives posted, in order, by context
	unexpected map[uint32][]*inMsg   // messages that came first, in order, by context
	arrived    chan struct{}         // closed (and replaced) when a message is queued unexpected
	sends      map[uint64]*Request   // rendezvous sends waiting for their finish frame
	pulls      map[uint64]*Request   // receives whose message is being pulled
	pushes     map[pushKey]*pushIn   // receives whose message is being pushed to them
	nextID     uint64
	backlog    map[int][]queued // frames to a rank that did not fit yet, in order
	bad        uint64           // malformed or impossible frames received
	failed     map[int]failure  // by world rank: the ranks a transport stopped carrying traffic from

	hdr          [hdrLen]byte  // scratch for a frame's header, under the lock
	parts        [2][]byte     // scratch for a frame's parts in send, under the lock
	wakeFDs      []int         // scratch of arm: the devices' descriptors to sleep on
	token        chan struct{} // held by the goroutine driving progress
	eagerMax     int           // largest payload sent eagerly
	spin         time.Duration // how long a driver polls before it sleeps
	yield        time.Duration // with spin < 0: how long it polls, yielding its CPU, before it sleeps
	counted      bool          // in engines: from Init to Finalize
	finalizing   bool          // Finalize has begun: another call of it fails
	closed       bool          // Finalize closed the transports: every call fails with ErrFinalized
	work         chan *job     // to an idle worker of the non-blocking collectives
	deferred     []*job        // small non-blocking collectives not yet run nor handed to a worker
	ndeferred    atomic.Int32  // len(deferred), read without the lock
	handOffTimer *time.Timer   // hands the deferred ones to workers
	handOffArmed bool          // the timer will fire
	handOffDelay time.Duration // how long the timer waits (handOffDelay)
	finished     chan struct{} // closed by Finalize: the workers end
	fatal        func() error  // non-nil when the job is gone (abort, lost server)
}

// status is what a probe of m tells: its source, tag and length.
func (m *inMsg) status() Status {
	return Status{Source: int(m.h.src), Tag: int(m.h.tag), Count: int(m.h.length)}
}

// queued is a frame waiting for room in its receiver's buffers, and the
// eager send it completes once it is out.
type queued struct {
	f []byte
	r *Request
}

// inMsg is a message that arrived before its receive was posted: an eager
// one's payload (copied), or a rendezvous' Remote.
type inMsg struct {
	h      header
	world  int // the sender's world rank, as the transport says
	data   []byte
	remote transport.Remote
}

func (e *engine) route(world int) (transport.Transport, error) {
	if world < 0 || world >= len(e.routes) || e.routes[world] == nil {
		return nil, fmt.Errorf("comm: no transport reaches rank %d from rank %d (node %d to node %d): %w",
			world, e.rank, e.nodes[e.rank], e.nodes[min(max(world, 0), len(e.nodes)-1)], transport.ErrUnreachable)
	}
	return e.routes[world], nil
}

// send sends a frame, hdr and then body (which may be empty), to world
// rank dst through tr, or queues a copy of it behind the frames already
// waiting for that rank. It returns whether the frame went out; a queued
// one completes r (if not nil) when it does. The lock is held.
func (e *engine) send(tr transport.Transport, dst int, r *Request, hdr, body []byte) (bool, error) {
	if len(e.backlog[dst]) == 0 {
		ok, err := e.trySend(tr, dst, hdr, body)
		if err != nil || ok {
			return ok, err
		}
	}
	f := append(append([]byte(nil), hdr...), body...)
	e.backlog[dst] = append(e.backlog[dst], queued{f, r})
	return false, nil
}

// trySend is tr.TrySend of a frame in two parts. The parts go in the
// engine's scratch array: a variadic slice of their own, escaping through
// the interface call, would cost an allocation per frame. TrySend copies
// them. The lock is held.
func (e *engine) trySend(tr transport.Transport, dst int, hdr, body []byte) (bool, error) {
	e.parts[0], e.parts[1] = hdr, body
	ok, err := tr.TrySend(dst, e.parts[:]...)
	e.parts = [2][]byte{} // holds no buffer of the caller's
	return ok, err
}

// flush sends what the backlog holds, in order, as far as the receivers
// have room. A rank that can no longer be sent to (its connection failed)
// fails the sends queued for it, and only those: the other ranks' traffic
// goes on. The lock is held.
func (e *engine) flush() int {
	if len(e.backlog) == 0 {
		return 0
	}
	n := 0
	for dst, qs := range e.backlog {
		tr := e.routes[dst]
		for len(qs) > 0 {
			ok, err := e.trySend(tr, dst, qs[0].f, nil)
			if err != nil {
				e.dropBacklog(dst, qs, err)
				qs = nil
				n++
				break
			}
			if !ok {
				break
			}
			if r := qs[0].r; r != nil {
				r.complete(r.st, nil)
			}
			qs[0] = queued{}
			qs = qs[1:]
			n++
		}
		if len(qs) == 0 {
			delete(e.backlog, dst)
		} else {
			e.backlog[dst] = qs
		}
	}
	return n
}

// dropBacklog fails the frames queued for dst, which cannot be sent:
// their requests complete with err, and so do the rendezvous sends to dst
// (their announcement may be among the frames, and dst's finish cannot
// come now) and the receives that asked dst to push their message (the
// request may be among the frames). The other frames of no request of
// their own (a finish, a push's data) are counted in the log, with the
// announcements. The caller takes the frames out of the backlog; the
// lock is held.
func (e *engine) dropBacklog(dst int, qs []queued, err error) {
	lost := 0
	for _, q := range qs {
		switch {
		case q.r == nil:
			lost++
		case !q.r.isDone():
			q.r.complete(Status{}, err)
		}
	}
	for id, r := range e.sends {
		if r.rdvWorld == dst {
			delete(e.sends, id)
			r.complete(r.st, errors.Join(err, r.tr.Unexpose(r.remote)))
		}
	}
	for k, p := range e.pushes {
		if k.world == dst {
			delete(e.pushes, k)
			p.r.complete(p.r.st, err)
		}
	}
	if lost > 0 {
		e.log.Error("comm: frames to a rank that cannot be reached dropped", "rank", dst, "frames", lost, "err", err)
	}
}

// progress runs every transport once. The lock is held.
func (e *engine) progress() (int, error) {
	if e.closed {
		return 0, ErrFinalized
	}
	n := e.flush()
	for _, tr := range e.trs {
		k, err := tr.Progress(e)
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// progressOnce progresses if no other goroutine is driving.
func (e *engine) progressOnce() {
	select {
	case e.token <- struct{}{}:
		e.mu.Lock()
		if _, err := e.progress(); err != nil && !errors.Is(err, ErrFinalized) {
			e.log.Error("progress", "err", err)
		}
		// After the job's end nothing completes what waits for the
		// other ranks: a Test loop would never end (a Wait returns
		// the error at once, await).
		if err := e.fatal(); err != nil {
			e.failPending(err, false)
		}
		e.mu.Unlock()
		<-e.token
	default:
	}
}

// await returns once cond holds, or with the context's or the job's error.
// The caller drives progress while it holds the token. When another
// goroutine holds it, the caller blocks until the token is free or one of
// the channels chans returns (called under the engine's lock) is closed:
// they are closed when cond may have come to hold.
func (e *engine) await(ctx context.Context, cond func() bool, chans func() []<-chan struct{}) error {
	var cases []reflect.SelectCase
	var one <-chan struct{}
	for !cond() {
		if err := e.fatal(); err != nil {
			return err
		}
		if e.ndeferred.Load() != 0 {
			e.handOff() // what this waits for may need them
		}
		select {
		case e.token <- struct{}{}: // nobody drives: this goroutine does
		default:
			if cases == nil && one == nil {
				var cs []<-chan struct{}
				if chans != nil {
					e.mu.Lock()
					cs = chans()
					e.mu.Unlock()
				}
				if len(cs) == 1 {
					one = cs[0]
				} else {
					cases = selectCases(ctx, e.token, cs)
				}
				continue // cond again: it may have come to hold before the channels were taken
			}
			if one != nil {
				select {
				case <-one:
					// Take the channels again: one that is replaced
					// when it closes (a new message's) stays closed.
					one = nil
					continue
				case <-ctx.Done():
					return ctx.Err()
				case e.token <- struct{}{}:
				}
			} else {
				switch i, _, _ := reflect.Select(cases); i {
				case 0:
					return ctx.Err()
				case 1:
				default:
					cases = nil // as for one
					continue
				}
			}
		}
		err := e.drive(ctx, cond)
		<-e.token
		if err != nil {
			return err
		}
	}
	return nil
}

// failPending completes every request still in the engine's queues with
// err, so that a Test loop ends too. Finalize calls it with ErrFinalized
// once the transports are closed; progressOnce with the job's end (an
// abort, a lost server) while they still run, leaving the receives being
// pulled (pulls false): a transport may still write their buffers, and
// completes them. The lock is held.
func (e *engine) failPending(err error, pulls bool) {
	fail := func(r *Request) {
		if r != nil && !r.isDone() {
			r.complete(Status{}, err)
		}
	}
	for ctx, q := range e.posted {
		for _, r := range q {
			fail(r)
		}
		delete(e.posted, ctx)
	}
	for id, r := range e.sends {
		fail(r)
		delete(e.sends, id)
	}
	for id, r := range e.pulls {
		if !pulls {
			break
		}
		fail(r)
		delete(e.pulls, id)
	}
	for k, p := range e.pushes {
		fail(p.r)
		delete(e.pushes, k)
	}
	for dst, qs := range e.backlog {
		for _, q := range qs {
			fail(q.r)
		}
		delete(e.backlog, dst)
	}
}

// kick wakes the goroutine that sleeps on the rank's bell, if the bell is
// still there.
func (e *engine) kick() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.closed {
		e.shm.Bell().Kick()
	}
}

// engines counts the ranks of this process: more than one in tests and
// in jobs run as goroutines of one process.
var engines atomic.Int32

// spinAlone is how long drive spins before it lets other goroutines have
// its P between polls. A small message's reply comes well within it when
// the peer runs on a CPU of its own, so a ping-pong never yields. Past it
// the spin yields, so that a rank waiting for a goroutine of its own
// process (another rank, the program's other work) lets it run instead of
// holding the P for the whole spin: with one P and two ranks in one
// process, comm's BenchmarkPingPong/8 took 1.25 ms a message, 53 µs with
// the yield.
const spinAlone = 50 * time.Microsecond

// drive progresses until cond holds, polling for e.spin after the last
// thing that happened (with a negative e.spin, for e.yield with a
// sched_yield between polls, or twice) and then sleeping on the rank's
// bell together with the devices' completion channels, which become
// readable only if armed just before the sleep (transport.Armer): the
// goroutine parks in Go's network poller (shm.Inbox.WaitFor), so that a
// sleeping rank holds no P. It slept in a futex, a system call, which
// keeps the thread's P until the runtime's monitor takes it back (every
// 20 µs to 10 ms); when every P was held so (ranks that are goroutines of
// one process, as many as GOMAXPROCS; GOMAXPROCS=1), a completion, whose
// kick came from a goroutine, waited that long, and so did the goroutines
// the rank's own doorbells woke (an in-process device's): two such ranks
// on two Ps, 8-byte round trips over RC, took 320 µs in the median and 10
// to 20 ms at the 99th percentile (BenchmarkSleepingPingPong). From
// spinAlone after it began, a spin yields its P between polls.
// The caller holds the token.
func (e *engine) drive(ctx context.Context, cond func() bool) error {
	var stop func() bool // the context's wake-up, armed before the first sleep
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	// The clock is read only every 16th poll while spinning (a read costs
	// about 56 ns on this project's virtual machine, a poll of an idle shm
	// ring a few): a message that comes within the first polls is not kept
	// waiting behind one. start and idleSince are set at the first read.
	var start, idleSince time.Time
	bell := e.shm.Bell()
	for i := 0; ; i++ {
		_, _, n, err := e.look(nil)
		if err != nil {
			return err
		}
		if cond() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if i&63 == 0 {
			if err := e.fatal(); err != nil {
				return err
			}
		}
		if n > 0 {
			idleSince = time.Time{}
			continue
		}
		if e.spin >= 0 && i&15 != 15 {
			continue
		}
		now := time.Now()
		if start.IsZero() {
			start = now
		}
		if idleSince.IsZero() {
			idleSince = now
			continue
		}
		if e.spin < 0 && e.yield > 0 && now.Sub(idleSince) < e.yield {
			// Not spinning: the ranks outnumber the CPUs. Let the
			// others have the CPU; this rank comes back as soon as
			// none of them wants it. The other ranks are other
			// processes: sched_yield, which keeps the P (with
			// runtime.Gosched as well, which wakes threads of this
			// process to look for work, a hop of a ring took 10 µs
			// instead of 2). Or they are goroutines of this one (tests,
			// jobs run in one process): Gosched, as they need the P
			// (a Barrier of 4 such ranks: 4.5 µs, against 44 to 69
			// sleeping and 693 with sched_yield).
			if engines.Load() > 1 {
				runtime.Gosched()
			} else {
				xunix.SchedYield()
			}
			continue
		}
		if e.spin >= 0 && now.Sub(idleSince) < e.spin {
			if now.Sub(start) >= spinAlone {
				// Let the other goroutines of this P run while spinning:
				// the program's own, or another rank of this process,
				// which may be the one to send what this one waits for.
				runtime.Gosched()
			}
			continue
		}
		// Sleep until a sender rings or a device completes; the timeout
		// bounds how late a wake-up that is not a frame (a backlog's
		// room, the job's end) is noticed. The devices' transports are
		// armed only now (an arm also takes the event that ended the last
		// sleep), and polled once more after the arm, which announces
		// nothing that came before it.
		if stop == nil && ctx.Done() != nil { // a context that cannot end needs none
			stop = context.AfterFunc(ctx, e.kick)
		}
		seq, fds, n, err := e.look(bell)
		if err != nil {
			return err
		}
		if n > 0 || cond() {
			idleSince = time.Time{}
			continue
		}
		// Finalize closes the devices' channels only once this goroutine
		// has given back the token, so the descriptors are theirs still.
		if err := bell.WaitFor(seq, 10*time.Millisecond, fds); err != nil {
			return err
		}
		idleSince = time.Time{}
	}
}

// look progresses once, under the lock. Before a sleep on bell (not nil)
// it first reads the bell's count, so that a Kick (a completion of another
// transport) after it makes the sleep return at once, and arms the device
// transports, returning the count and their descriptors. The count is read
// under the lock, as Finalize unmaps the bell under it.
func (e *engine) look(bell *shm.Inbox) (seq uint32, fds []int, n int, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, nil, 0, ErrFinalized
	}
	if bell != nil {
		seq = bell.Seq()
		if fds, err = e.arm(); err != nil {
			return 0, nil, 0, err
		}
	}
	n, err = e.progress()
	return seq, fds, n, err
}

// arm asks the transports whose work comes from a device to wake the rank
// at the next completion (transport.Armer), and returns the descriptors
// that become readable then, for the sleep (valid until the next arm).
// The lock is held.
func (e *engine) arm() ([]int, error) {
	fds := e.wakeFDs[:0]
	for _, tr := range e.trs {
		if a, ok := tr.(transport.Armer); ok {
			if err := a.Arm(); err != nil {
				return nil, err
			}
			if fd := a.WakeFD(); fd >= 0 {
				fds = append(fds, fd)
			}
		}
	}
	e.wakeFDs = fds
	return fds, nil
}
