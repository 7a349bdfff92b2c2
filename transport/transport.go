// Package transport is the interface between comm and the fabrics that
// move its messages: shared memory between the ranks of a node
// (transport/shm), and RC or XRC queue pairs between nodes
// (transport/rc, transport/xrc).
//
// A transport moves two kinds of things for comm: eager frames (small
// messages with comm's header, copied into the receiver's buffers and
// delivered in order per sender), and large payloads that a receiver pulls
// from memory the sender exposed (rendezvous). comm drives every transport
// from one goroutine: it calls TrySend, Read and Progress, and sleeps on
// the rank's Bell when nothing is pending.
package transport

import (
	"context"
	"errors"
)

// Peer is what a transport learns of another rank at Connect: who it is,
// where it runs, and the record its transport of the same kind published.
type Peer struct {
	Rank, Node, LocalRank int
	Record                []byte
}

// Remote describes memory a rank exposed to its peers (Expose), in a
// form that travels inside comm's frames: at most MaxRemote bytes, opaque
// to everyone but the transport that made it.
type Remote []byte

// MaxRemote is the largest Remote a transport makes.
const MaxRemote = 32

// Handler receives what Progress finds.
type Handler interface {
	// Deliver hands over an eager frame from rank. frame is valid only
	// during the call: the handler copies what it keeps.
	Deliver(rank int, frame []byte)
	// ReadDone completes the Read with this cookie.
	ReadDone(cookie uint64, err error)
}

// PeerFailureHandler is a Handler that also hears of a peer a transport
// stopped carrying traffic from, for good: shm, the peer's ring was found
// corrupt; rc, the QP toward the peer failed (a completion error: retries
// or RNR retries exhausted, a remote access or operation error; a QP
// error event; a lazy connection that could not be made); xrc, the TGT
// QP that carries the peer's frames to this node failed, or this rank's
// INI QP toward the peer's node did (then it can neither send to the
// node's ranks, nor read from them, nor return their credits). Sends to
// and Reads from that peer fail from then on, and no frame of its is
// delivered after the call; the handler fails what waits for it. Progress
// calls PeerFailed once per peer, when its Handler is one; err says why
// (rc and xrc: it wraps the verbs.WCStatus or verbs.EventType that told).
type PeerFailureHandler interface {
	Handler
	PeerFailed(rank int, err error)
}

// Transport is one fabric as comm sees it. Its methods are called from one
// goroutine, except Name and Reaches.
type Transport interface {
	// Name is "shm", "rc" or "xrc".
	Name() string
	// Record is this rank's record, to be all-gathered before Connect.
	Record() []byte
	// Connect learns every rank of the job (peers is indexed by rank and
	// includes this one) and connects to those it reaches; a transport
	// that connects lazily only checks and keeps the records.
	Connect(ctx context.Context, peers []Peer) error
	// Reaches reports whether this transport carries traffic to rank.
	Reaches(rank int) bool
	// MaxEager is the largest frame TrySend takes.
	MaxEager() int
	// TrySend sends one frame made of parts to rank, copying them. It
	// returns false when there is no room now (the receiver is behind):
	// the caller progresses and tries again. Frames to one rank arrive in
	// the order they were sent.
	TrySend(rank int, parts ...[]byte) (bool, error)
	// Expose lets the peers read buf until Unexpose. The caller keeps
	// buf alive and unmoved until then.
	Expose(buf []byte) (Remote, error)
	Unexpose(Remote) error
	// Read copies len(dst) bytes of the memory src describes, exposed by
	// rank, into dst, and reports completion to the handler of a later
	// Progress (or of this one) with cookie. dst must stay alive until
	// then.
	Read(rank int, dst []byte, src Remote, cookie uint64) error
	// Progress delivers frames and completions to h and returns how many.
	Progress(h Handler) (int, error)
	// Close disconnects and frees everything the transport holds.
	Close() error
}

// Armer is a Transport whose Progress finds work that arrives without the
// caller's Kick: completions of a device. Arm asks for one Kick at the next
// such arrival. The caller arms only before it sleeps, then runs Progress
// once more (what arrived before the arm may not kick) and sleeps only if
// that found nothing. While the caller polls, nothing is armed, so that a
// busy rank costs the device no events and its own process no wake-ups.
// Arming again while armed, or after a Kick that the caller has not slept
// for, is cheap and harmless.
//
// WakeFD is a descriptor that becomes readable at the arrival an Arm asked
// for (-1: none): the caller may sleep on it (poll, epoll) together with
// its own wake-ups instead of waiting for the Kick, which comes from a
// goroutine and so needs a free P of the process. The next Arm takes what
// made it readable, so that it ends no later wait.
type Armer interface {
	Transport
	Arm() error
	WakeFD() int
}

// ErrUnreachable reports a rank the transport does not carry traffic to.
var ErrUnreachable = errors.New("transport: rank not reachable by this transport")

// ErrReadRefused reports a Read the system does not allow (a shared-memory
// transport whose kernel forbids reading another process's memory): the
// caller moves the data another way.
var ErrReadRefused = errors.New("transport: direct reads of the peer's memory are not allowed")

// ErrBadRemote reports a Remote that this transport did not make or that
// does not cover the read.
var ErrBadRemote = errors.New("transport: bad remote memory descriptor")
