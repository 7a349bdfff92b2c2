package comm

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/xrcrun/xrc/transport"
)

// Status describes a message that was received or probed.
type Status struct {
	Source int // the sender's rank in the communicator
	Tag    int
	Count  int // bytes received (Recv) or in the message (Probe)
}

// Wildcards for receives and probes.
const (
	AnySource = -1
	AnyTag    = -1
)

// ErrTruncate reports a message longer than the receive buffer: the
// buffer holds its first bytes and the status says how many. The error a
// receive returns is a *TruncateError, which also gives the message's
// length.
var ErrTruncate = errors.New("comm: message longer than the receive buffer")

// TruncateError is the error of a receive whose message was longer than
// its buffer; errors.Is(err, ErrTruncate) matches it.
type TruncateError struct {
	Len int // the message's length in bytes
	Cap int // the receive buffer's, which took its first Cap bytes
}

func (e *TruncateError) Error() string {
	return fmt.Sprintf("%v: %d bytes into %d", ErrTruncate, e.Len, e.Cap)
}

// Unwrap returns ErrTruncate.
func (e *TruncateError) Unwrap() error { return ErrTruncate }

// ErrFinalized is the error of the calls of a rank that has finalized.
var ErrFinalized = errors.New("comm: the rank has finalized")

// ErrFreed is the error of calls on a communicator that was freed.
var ErrFreed = errors.New("comm: the communicator was freed")

// ErrCanceled is the error of a receive taken back by Cancel.
var ErrCanceled = errors.New("comm: receive canceled")

// Request is a send, a receive or a collective in progress (Isend, Irecv,
// Message.Irecv, Ibarrier, Iallreduce, …). Its buffers belong to the
// request until it completes: the caller must not touch them before Wait
// or Test says so. A request may be waited for and tested by several
// goroutines, and again once complete.
type Request struct {
	e      *engine
	pooled bool // made by a blocking call, recycled when it returns
	coll   job  // a non-blocking collective's body, which a worker runs, or Wait (isColl)
	done   atomic.Bool
	ch     chan struct{} // closed at completion; made only for a goroutine that blocks on it, under the engine's lock
	st     Status
	err    error

	// A receive: where it goes and what it matches.
	c        *Comm
	buf      []byte
	src, tag int

	// A receive being pulled (rendezvous): the sender's world rank and
	// its request id, for the finish frame; whether the message was
	// longer than buf.
	// A rendezvous send: the receiver's world rank, whose finish frame
	// completes it.
	rdvWorld int
	rdvID    uint64
	msgLen   uint64
	trunc    bool

	// A rendezvous send: what it exposed, until the receiver's finish,
	// and the buffer, kept reachable so that the garbage collector does
	// not free memory a peer is reading.
	tr     transport.Transport
	remote transport.Remote
	sbuf   []byte
}

func newRequest(e *engine) *Request { return &Request{e: e} }

// requests recycles the requests of the blocking calls (Send, Recv),
// which no caller sees: once one completes, the engine holds no reference
// to it either.
var requests = sync.Pool{New: func() any { return new(Request) }}

func pooledRequest(e *engine) *Request {
	r := requests.Get().(*Request)
	r.e, r.pooled = e, true
	return r
}

// release gives a blocking call's request back once it has completed; one
// whose wait ended early (its context) may still be in the engine's
// queues and is left to the garbage collector.
func (r *Request) release() {
	if !r.pooled || !r.done.Load() {
		return
	}
	*r = Request{}
	requests.Put(r)
}

// complete ends the request; the engine's lock is held. Once done is
// set, r is its waiter's: a blocking call's request may be back in the
// pool and in another call an instant later, so nothing here reads r
// after that.
func (r *Request) complete(st Status, err error) {
	r.st, r.err = st, err
	r.buf, r.sbuf = nil, nil
	ch := r.ch
	r.done.Store(true)
	if ch != nil {
		close(ch)
	}
}

func (r *Request) isDone() bool { return r.done.Load() }

// isColl reports whether r is a non-blocking collective's.
func (r *Request) isColl() bool { return r.coll.c != nil }

// doneChan returns a channel closed when r completes, making it the first
// time; the engine's lock is held.
func (r *Request) doneChan() <-chan struct{} {
	if r.ch == nil {
		r.ch = make(chan struct{})
		if r.done.Load() {
			close(r.ch)
		}
	}
	return r.ch
}

// Wait blocks until the request completes or ctx ends, driving the
// rank's progress meanwhile, and returns its status and the error it
// completed with. If ctx ends first, Wait returns ctx's error and the
// request goes on, its buffer still its own: Wait again, or Cancel a
// receive. A request that completed as ctx ended returns how it
// completed. A nil request (MPI's MPI_REQUEST_NULL) returns at once with
// an empty status.
func (r *Request) Wait(ctx context.Context) (Status, error) {
	if r == nil {
		return Status{}, nil
	}
	if r.isDone() {
		return r.st, r.err
	}
	if r.isColl() {
		return r.waitColl(ctx)
	}
	if err := r.e.await(ctx, r.isDone, func() []<-chan struct{} { return []<-chan struct{}{r.doneChan()} }); err != nil && !r.isDone() {
		return Status{}, err
	}
	return r.st, r.err
}

// waitRecv waits for receive r. If ctx ends before a message matches, it
// takes the receive back and returns ctx's error: the buffer is the
// caller's again, and the message goes to a later receive. One that has
// matched is received, whatever ctx; the job's end still ends the wait.
func waitRecv(ctx context.Context, r *Request) (Status, error) {
	st, err := r.Wait(ctx)
	if err != nil && ctx.Err() != nil && !r.Cancel() {
		// Matched, or even done since Wait returned: the message is
		// coming into the buffer, or there.
		st, err = r.Wait(context.WithoutCancel(ctx))
	}
	return st, err
}

// waitColl waits for a non-blocking collective. If ctx cannot end and no
// worker has taken its body yet, this goroutine runs it, as the blocking
// call would (the body heeds only the context the collective was started
// with, so a Wait whose ctx can end hands it to a worker). Otherwise it
// waits without driving progress: the worker does, and this goroutine
// would only take turns with it, each turn a thread's wake-up (an 8-byte
// Iallreduce of two ranks took 60 to 70 µs so, against 1 µs for
// Allreduce).
func (r *Request) waitColl(ctx context.Context) (Status, error) {
	if ctx.Done() == nil && r.coll.claim() {
		r.e.mu.Lock()
		r.e.undefer(&r.coll)
		r.e.mu.Unlock()
		r.coll.do()
		return r.st, r.err
	}
	r.e.handOffFor(r)
	r.e.mu.Lock()
	ch := r.doneChan()
	r.e.mu.Unlock()
	select {
	case <-ch:
		return r.st, r.err
	case <-ctx.Done():
		if r.isDone() {
			return r.st, r.err
		}
		return Status{}, ctx.Err()
	}
}

// Cancel takes back a receive that no message has matched yet: it
// completes with ErrCanceled, its buffer is the caller's again, and the
// message it would have matched goes to another receive. It reports
// whether it did; a receive already matched (its message may be on its
// way into the buffer), a completed request or a send cannot be taken
// back, and Wait will tell how it ends.
func (r *Request) Cancel() bool {
	if r == nil {
		return false
	}
	e := r.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.isDone() || r.c == nil {
		return false
	}
	q := e.posted[r.c.ctx]
	for i, p := range q {
		if p == r {
			e.posted[r.c.ctx] = removeAt(q, i)
			r.complete(Status{}, ErrCanceled)
			return true
		}
	}
	return false
}

// Test progresses once and reports whether the request is complete, with
// its status if so. For a non-blocking collective it hands the collective
// to a worker if it was deferred (nonblocking.go) and yields the processor
// instead, so that the worker runs even where it shares this goroutine's
// (GOMAXPROCS=1): a loop of Tests does not starve it.
func (r *Request) Test() (bool, Status, error) {
	switch {
	case r == nil: // MPI_REQUEST_NULL
		return true, Status{}, nil
	case r.isDone():
	case r.isColl():
		r.e.handOffFor(r)
		runtime.Gosched()
	default:
		r.e.progressOnce()
	}
	if !r.isDone() {
		return false, Status{}, nil
	}
	return true, r.st, r.err
}

// Waitall waits for every request and returns their statuses, and the
// errors of those that failed, joined. A nil request is done, with an
// empty status. If ctx ends first, Waitall returns its error at once,
// with the statuses of the requests before the first one not complete;
// the others go on, as after Wait.
func Waitall(ctx context.Context, reqs ...*Request) ([]Status, error) {
	sts := make([]Status, len(reqs))
	var errs []error
	for i, r := range reqs {
		st, err := r.Wait(ctx)
		if r != nil && !r.isDone() { // the context ended, or the job
			return sts, err
		}
		sts[i] = st
		errs = append(errs, err)
	}
	return sts, errors.Join(errs...)
}

// Waitany waits until one of reqs completes and returns its index and
// status. Requests already reported may be passed again: they are ready.
// Nil requests are left out (as MPI's MPI_REQUEST_NULL); if all are nil,
// or reqs is empty, Waitany returns index -1 (MPI_UNDEFINED) and no
// error, as MPI_Waitany does. The error of the request that
// completed is returned with its index; if ctx ends first, Waitany
// returns -1 and ctx's error.
func Waitany(ctx context.Context, reqs ...*Request) (int, Status, error) {
	first := slices.IndexFunc(reqs, func(r *Request) bool { return r != nil })
	if first < 0 {
		return -1, Status{}, nil
	}
	idx := -1
	ready := func() bool {
		for i, r := range reqs {
			if r != nil && r.isDone() {
				idx = i
				return true
			}
		}
		return false
	}
	if err := reqs[first].e.await(ctx, ready, func() []<-chan struct{} {
		var chans []<-chan struct{}
		for _, r := range reqs {
			if r != nil {
				chans = append(chans, r.doneChan())
			}
		}
		return chans
	}); err != nil && !ready() {
		return -1, Status{}, err
	}
	return idx, reqs[idx].st, reqs[idx].err
}

// Testall progresses once and reports whether all reqs are complete. A
// nil request is. It reports neither statuses nor errors: Test or Wait
// each request for them.
func Testall(reqs ...*Request) bool {
	if i := slices.IndexFunc(reqs, func(r *Request) bool { return r != nil }); i >= 0 {
		reqs[i].e.handOffFor(reqs...)
		reqs[i].e.progressOnce()
	}
	for _, r := range reqs {
		if r != nil && !r.isDone() {
			return false
		}
	}
	return true
}

// selectCases builds the cases await selects on: the context, the
// progress token, then the channels that say the condition may hold.
func selectCases(ctx context.Context, token chan struct{}, chans []<-chan struct{}) []reflect.SelectCase {
	cs := []reflect.SelectCase{
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		{Dir: reflect.SelectSend, Chan: reflect.ValueOf(token), Send: reflect.ValueOf(struct{}{})},
	}
	for _, c := range chans {
		cs = append(cs, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)})
	}
	return cs
}
