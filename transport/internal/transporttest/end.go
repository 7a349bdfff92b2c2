package transporttest

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/xrcrun/xrc/transport"
)

// Kicker lets a test wait for a transport's kick.
type Kicker struct{ C chan struct{} }

// NewKicker makes a Kicker; Kick is the transport's Config.Kick.
func NewKicker() *Kicker { return &Kicker{C: make(chan struct{}, 1)} }

// Kick wakes a test waiting on C, if none is pending.
func (k *Kicker) Kick() {
	select {
	case k.C <- struct{}{}:
	default:
	}
}

// Handler records what Progress delivers: copies of the frames by sender,
// in order, the reads' errors by cookie, and the errors of the peers
// failed (transport.PeerFailureHandler), each call's, by rank.
type Handler struct {
	Frames map[int][][]byte
	Reads  map[uint64]error
	Failed map[int][]error
}

var _ transport.PeerFailureHandler = (*Handler)(nil)

// NewHandler makes an empty Handler.
func NewHandler() *Handler {
	return &Handler{Frames: map[int][][]byte{}, Reads: map[uint64]error{}, Failed: map[int][]error{}}
}

// Deliver records a copy of f.
func (h *Handler) Deliver(rank int, f []byte) {
	h.Frames[rank] = append(h.Frames[rank], append([]byte(nil), f...))
}

// ReadDone records err.
func (h *Handler) ReadDone(cookie uint64, err error) { h.Reads[cookie] = err }

// PeerFailed records err.
func (h *Handler) PeerFailed(rank int, err error) { h.Failed[rank] = append(h.Failed[rank], err) }

// Progresser is what an End drives: a transport, or verbsx's Endpoint.
type Progresser interface {
	Progress(h transport.Handler) (int, error)
}

// End is one rank of a test job: its transport (or Endpoint), handler
// and kicker.
type End[T Progresser] struct {
	Tr T
	H  *Handler
	K  *Kicker
}

// NewEnd makes the end of tr, made with the kicker k, and closes tr when
// the test ends.
func NewEnd[T transport.Transport](t testing.TB, tr T, k *Kicker) *End[T] {
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Error(err)
		}
	})
	return &End[T]{Tr: tr, H: NewHandler(), K: k}
}

// Connect connects every end through an exchange of their records: the
// rank of ends[r] is r, on node nodes[r].
func Connect[T transport.Transport](t testing.TB, ends []*End[T], nodes []int) {
	t.Helper()
	peers := make([]transport.Peer, len(ends))
	for r, e := range ends {
		peers[r] = transport.Peer{Rank: r, Node: nodes[r], Record: e.Tr.Record()}
	}
	for _, e := range ends {
		if err := e.Tr.Connect(context.Background(), peers); err != nil {
			t.Fatal(err)
		}
	}
}

// Progress runs Progress on every end until cond holds, sleeping on the
// ends' kicks when nothing moves. The deadline only guards against a
// hang.
func Progress[T Progresser](t testing.TB, ends []*End[T], cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for idle := 0; !cond(); {
		n := 0
		for _, e := range ends {
			k, err := e.Tr.Progress(e.H)
			if err != nil {
				t.Fatal(err)
			}
			n += k
		}
		if n == 0 {
			idle++
			if idle%64 == 0 {
				// Sleep until some end's completion kicks: arm the
				// end, poll it once more (the arm announces nothing
				// that came before it), and sleep if that found none.
				e := ends[idle/64%len(ends)]
				if a, ok := any(e.Tr).(transport.Armer); ok {
					if err := a.Arm(); err != nil {
						t.Fatal(err)
					}
					k, err := e.Tr.Progress(e.H)
					if err != nil {
						t.Fatal(err)
					}
					if k > 0 {
						continue
					}
				}
				select {
				case <-e.K.C:
				case <-time.After(time.Millisecond):
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no progress for 3 minutes")
		}
	}
}

// OneWay sends n frames from rank from to rank to, with no traffic back
// but what the transports send themselves (credits), and waits for them
// all to arrive, in order.
func OneWay[T transport.Transport](t testing.TB, ends []*End[T], from, to, n int) {
	t.Helper()
	sent := 0
	Progress(t, ends, func() bool {
		for sent < n {
			ok, err := ends[from].Tr.TrySend(to, Pattern(sent, 8))
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			sent++
		}
		return len(ends[to].H.Frames[from]) == n
	})
	for i, f := range ends[to].H.Frames[from] {
		if !bytes.Equal(f, Pattern(i, 8)) {
			t.Fatalf("frame %d from rank %d to %d differs", i, from, to)
		}
	}
}

// AfterClose checks that tr, closed, refuses every call with an error that
// matches net.ErrClosed, touching none of the memory Close freed. peer is
// a rank it reached.
func AfterClose(t testing.TB, tr transport.Transport, peer int) {
	t.Helper()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	h := NewHandler()
	if _, err := tr.Progress(h); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Progress after Close: %v", err)
	}
	if _, err := tr.TrySend(peer, make([]byte, 100)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("TrySend after Close: %v", err)
	}
	if _, err := tr.Expose(make([]byte, 100)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Expose after Close: %v", err)
	}
	if err := tr.Read(peer, make([]byte, 100), make(transport.Remote, 32), 1); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close: %v", err)
	}
}

// AwaitFailed runs Progress on e until every rank of peers was reported
// failed, for up to 10 seconds, sleeping on e's kicks a millisecond at a
// time but never arming (a rank whose device is gone has nothing to arm),
// and then 100 times more, so that a report made twice shows.
func AwaitFailed[T Progresser](t testing.TB, e *End[T], peers ...int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for slices.ContainsFunc(peers, func(r int) bool { return len(e.H.Failed[r]) == 0 }) {
		if time.Now().After(deadline) {
			t.Fatalf("no failure of ranks %v reported in 10 s: heard %v", peers, e.H.Failed)
		}
		if _, err := e.Tr.Progress(e.H); err != nil {
			t.Fatalf("Progress: %v", err)
		}
		select {
		case <-e.K.C:
		case <-time.After(time.Millisecond):
		}
	}
	for range 100 {
		if _, err := e.Tr.Progress(e.H); err != nil {
			t.Fatal(err)
		}
	}
}
