package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/transport"
)

// Config configures a shared-memory transport.
type Config struct {
	// Dir holds the ranks' inbox files: a directory on tmpfs that all
	// ranks of the node can reach (the job's runtime directory, or
	// /dev/shm). Required.
	Dir string
	// JobID names the files, so that jobs sharing Dir do not meet.
	JobID string
	// RingData is the data size of each sender's ring in an inbox: a power
	// of two; 0 means 64 KiB.
	RingData int
	// NoPull makes every Read fail with transport.ErrReadRefused, as when
	// the kernel forbids process_vm_readv: for tests of the fallback, and
	// for users who prefer copies through the rings (XRC_SHM_NOPULL=1).
	NoPull bool
	// Rank, LocalRank and LocalSize place this rank on its node.
	Rank, LocalRank, LocalSize int
	// Logger gets the transport's logs; nil discards them.
	Logger *slog.Logger
	// Registerer, when not nil, gets the transport's counters, labeled
	// with the rank.
	Registerer prometheus.Registerer
}

// Transport is the shared-memory transport of one rank: its inbox, which
// every rank of the node (itself included) writes to through a ring of its
// own, and an outbox into each of theirs. It implements transport.Transport
// for the ranks of its node.
type Transport struct {
	cfg     Config
	inbox   *Inbox
	path    string
	out     map[int]*Outbox // by rank
	pid     map[int]int     // by rank: the pid whose memory its Remotes name
	senders []int           // rank of each ring of the inbox, by local rank; -1 until connected
	// broken holds, by rank, why the peer's ring into the inbox was found
	// corrupt: Progress reads it no more, and every later call toward
	// the peer returns the error.
	broken   map[int]error
	maxEager int        // the largest frame every connected peer's ring takes
	done     []readDone // completions of Reads, for the next Progress
	log      *slog.Logger
	m        *metrics
	closed   bool
}

// errClosed is the error of a call after Close.
var errClosed = fmt.Errorf("shm: %w", net.ErrClosed)

type readDone struct {
	cookie uint64
	err    error
}

var _ transport.Transport = (*Transport)(nil)

// New creates the rank's inbox in cfg.Dir. Its file is removed by Close.
func New(cfg Config) (*Transport, error) {
	if cfg.Dir == "" {
		return nil, errors.New("shm: no directory for the inboxes")
	}
	if cfg.RingData == 0 {
		cfg.RingData = 64 << 10
	}
	if cfg.LocalRank < 0 || cfg.LocalRank >= cfg.LocalSize {
		return nil, fmt.Errorf("shm: local rank %d of %d", cfg.LocalRank, cfg.LocalSize)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(cfg.Registerer, cfg.Rank)
	if err != nil {
		return nil, err
	}
	// The node's ranks pull large messages out of this process's memory.
	unix.AllowPeerReads()
	path := filepath.Join(cfg.Dir, fmt.Sprintf("shm-%s-%d", cfg.JobID, cfg.Rank))
	in, err := CreateInbox(path, cfg.LocalSize, cfg.RingData)
	if err != nil {
		m.unregister()
		return nil, err
	}
	t := &Transport{cfg: cfg, inbox: in, path: path, out: map[int]*Outbox{}, pid: map[int]int{},
		senders: make([]int, cfg.LocalSize), broken: map[int]error{},
		maxEager: cfg.RingData/4 - frameHdr, log: cfg.Logger, m: m}
	for i := range t.senders {
		t.senders[i] = -1
	}
	return t, nil
}

// Name is "shm".
func (t *Transport) Name() string { return "shm" }

// Bell is the rank's inbox: where it sleeps when idle, and what other
// ranks of the node ring when they send to it.
func (t *Transport) Bell() *Inbox { return t.inbox }

// Record is the inbox's path and this process's pid.
func (t *Transport) Record() []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(os.Getpid()))
	return append(b, t.path...)
}

func parseRecord(b []byte) (pid int, path string, err error) {
	if len(b) < 5 || len(b) > 4096 {
		return 0, "", fmt.Errorf("shm: record of %d bytes", len(b))
	}
	return int(binary.LittleEndian.Uint32(b)), string(b[4:]), nil
}

// Connect maps the inbox of every rank of this node, this one's included.
// The peers' inboxes must exist: they made them before publishing their
// records. Each inbox's header gives the size of its rings, which its
// owner chose: MaxEager is the smallest one's from now on.
func (t *Transport) Connect(ctx context.Context, peers []transport.Peer) error {
	me := peers[t.cfg.Rank]
	for _, p := range peers {
		if p.Node != me.Node {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p.LocalRank < 0 || p.LocalRank >= t.cfg.LocalSize || t.senders[p.LocalRank] != -1 {
			return fmt.Errorf("shm: rank %d has local rank %d: out of range or taken", p.Rank, p.LocalRank)
		}
		pid, path, err := parseRecord(p.Record)
		if err != nil {
			return fmt.Errorf("rank %d: %w", p.Rank, err)
		}
		o, err := OpenOutbox(path, t.cfg.LocalRank)
		if err != nil {
			return fmt.Errorf("rank %d: %w", p.Rank, err)
		}
		if o.Owner() != pid {
			o.Close()
			return fmt.Errorf("shm: rank %d: inbox %s belongs to pid %d, not %d", p.Rank, path, o.Owner(), pid)
		}
		t.out[p.Rank], t.pid[p.Rank], t.senders[p.LocalRank] = o, pid, p.Rank
		t.maxEager = min(t.maxEager, o.Ring().MaxFrame())
	}
	return nil
}

// Reaches reports whether rank is on this node (this rank included).
func (t *Transport) Reaches(rank int) bool { _, ok := t.out[rank]; return ok }

// MaxEager is the largest frame every ring this rank sends into takes: the
// smallest over the inboxes of the peers connected so far, whose owners
// may have chosen rings of other sizes (before Connect, this rank's own).
func (t *Transport) MaxEager() int { return t.maxEager }

// TrySend writes a frame into rank's inbox and wakes it if it sleeps.
func (t *Transport) TrySend(rank int, parts ...[]byte) (bool, error) {
	if t.closed {
		return false, errClosed
	}
	o := t.out[rank]
	if o == nil {
		return false, fmt.Errorf("%w: rank %d", transport.ErrUnreachable, rank)
	}
	if err := t.failed(rank); err != nil {
		return false, err
	}
	return o.Write(parts...)
}

// A Remote of this transport: the pid, the address and the length.
const remoteLen = 20

// Expose describes buf for a peer's Read: its address in this process.
func (t *Transport) Expose(buf []byte) (transport.Remote, error) {
	if t.closed {
		return nil, errClosed
	}
	r := make([]byte, 0, remoteLen)
	r = binary.LittleEndian.AppendUint32(r, uint32(os.Getpid()))
	r = binary.LittleEndian.AppendUint64(r, uint64(unix.AddrOf(buf)))
	r = binary.LittleEndian.AppendUint64(r, uint64(len(buf)))
	return r, nil
}

// Unexpose is a no-op: exposure is the process's address space, which
// the node's ranks may read anyway with the rights Pull needs.
func (t *Transport) Unexpose(transport.Remote) error { return nil }

// Read pulls len(dst) bytes of src, which rank exposed, with one copy.
// The completion is reported by the next Progress.
func (t *Transport) Read(rank int, dst []byte, src transport.Remote, cookie uint64) error {
	if t.closed {
		return errClosed
	}
	pid, ok := t.pid[rank]
	if !ok {
		return fmt.Errorf("%w: rank %d", transport.ErrUnreachable, rank)
	}
	if err := t.failed(rank); err != nil {
		return err
	}
	if len(src) != remoteLen || int(binary.LittleEndian.Uint32(src)) != pid ||
		uint64(len(dst)) > binary.LittleEndian.Uint64(src[12:]) {
		return fmt.Errorf("%w: %d bytes from rank %d", transport.ErrBadRemote, len(dst), rank)
	}
	var err error
	if t.cfg.NoPull {
		err = fmt.Errorf("shm: %w (NoPull)", transport.ErrReadRefused)
	} else {
		err = Pull(pid, binary.LittleEndian.Uint64(src[4:]), dst)
	}
	t.done = append(t.done, readDone{cookie, err})
	return nil
}

// progressBatch bounds the frames taken from one ring per Progress, so
// that one busy sender does not starve the others.
const progressBatch = 32

// Progress delivers the frames waiting in the inbox, each ring in turn,
// and the completed Reads. A corrupt ring fails its sender alone (fail):
// Progress reads it no more and goes on with the others, and returns an
// error only after Close.
func (t *Transport) Progress(h transport.Handler) (int, error) {
	if t.closed {
		return 0, errClosed
	}
	n := 0
	// A Read that ReadDone starts goes to a new list, for the next
	// Progress.
	done := t.done
	t.done = nil
	for _, d := range done {
		h.ReadDone(d.cookie, d.err)
		n++
	}
	if t.done == nil {
		clear(done)
		t.done = done[:0]
	}
	for i, rank := range t.senders {
		if rank < 0 || t.failed(rank) != nil {
			continue
		}
		c := t.inbox.Ring(i)
		took := 0
		for range progressBatch {
			f, err := c.Next()
			if err != nil {
				t.fail(rank, err)
				if pf, ok := h.(transport.PeerFailureHandler); ok {
					pf.PeerFailed(rank, t.broken[rank])
				}
				break
			}
			if f == nil {
				break
			}
			h.Deliver(rank, f)
			c.Release()
			took++
		}
		if took > 0 {
			// A sender that found the ring full may sleep until it has
			// room: wake it.
			if c.Unblocked() {
				t.out[rank].Room()
			}
			n += took
		}
	}
	return n, nil
}

// failed is why rank failed (fail), or nil. A send costs no map lookup
// while every peer is well.
func (t *Transport) failed(rank int) error {
	if len(t.broken) == 0 {
		return nil
	}
	return t.broken[rank]
}

// fail marks rank failed because its ring into the inbox is corrupt (err
// wraps ErrCorrupt): it is logged and counted once, its ring is read no
// more (its Consumer stays stopped, and no longer Pending), and every later
// TrySend and Read toward it returns the error, which wraps ErrCorrupt.
// The other ranks' traffic goes on.
func (t *Transport) fail(rank int, err error) {
	err = fmt.Errorf("shm: rank %d: its ring into this rank's inbox: %w", rank, err)
	t.broken[rank] = err
	t.m.peerErrors.Inc()
	t.log.Error("peer failed", "peer", rank, "err", err)
}

// Close unmaps the peers' inboxes and removes this rank's.
func (t *Transport) Close() error {
	if t.closed {
		return nil
	}
	t.closed = true
	var errs []error
	for _, o := range t.out {
		errs = append(errs, o.Close())
	}
	t.out = nil
	errs = append(errs, t.inbox.Close())
	t.m.unregister()
	return errors.Join(errs...)
}
