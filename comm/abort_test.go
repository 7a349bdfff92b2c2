package comm

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/bootstrap/boottest"
)

// freezer forwards TCP connections to a server until frozen: from then on
// it forwards nothing more either way and keeps the connections open, as a
// rendezvous server that has stalled.
type freezer struct {
	ln     net.Listener
	frozen chan struct{}
}

func newFreezer(t *testing.T, to string) *freezer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, frozen: make(chan struct{})}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", to)
			if err != nil {
				a.Close()
				continue
			}
			t.Cleanup(func() { a.Close(); b.Close() })
			go f.pipe(a, b)
			go f.pipe(b, a)
		}
	}()
	return f
}

// pipe copies from src to dst until frozen.
func (f *freezer) pipe(dst io.Writer, src io.Reader) {
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		select {
		case <-f.frozen:
			return // what was read is held back
		default:
		}
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *freezer) freeze() { close(f.frozen) }

// TestAbortBounded: Abort's wait for the rendezvous server to spread the
// abort is bounded, so that a stalled server does not keep an aborting
// process alive (with a context that never ends it waited for ever, and
// the process never exited).
func TestAbortBounded(t *testing.T) {
	old := abortWait
	abortWait = time.Second
	defer func() { abortWait = old }()
	addr, key := boottest.Server(t, 1)
	f := newFreezer(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env := bootstrap.Env{Rank: 0, Size: 1, LocalSize: 1, Nodes: 1, Addr: f.ln.Addr().String(), Key: key, JobID: "t"}
	bc, err := bootstrap.Join(ctx, env.Addr, key, bootstrap.Member{}, 1, bootstrap.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := Init(ctx, Config{Bootstrap: bc, Env: &env, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	f.freeze()
	done := make(chan error, 1)
	go func() { done <- c.abortJob(context.Background(), 3, "test") }()
	select {
	case err := <-done:
		t.Logf("abort with a stalled server: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("Abort still waiting for a stalled server a minute on")
	}
}
