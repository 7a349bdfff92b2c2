package bootstrap

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Peers that do not follow the protocol: the server and the client refuse
// what they send, and go on or end with a clear error.

// TestGatherBeforeEveryRankJoined: a rank that sends a collective before
// the others have joined (a client waits for the member table, so only a
// bad peer does) is refused as out of place, and the server goes on: the
// job aborts naming it, as for any bad message. The server used to walk
// the members not registered yet and crash the launcher.
func TestGatherBeforeEveryRankJoined(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 2})
	rc := dialRaw(t, ts.Addr())
	rc.authenticate(t, testKey)
	if err := rc.fc.send(&msgRegister{Rank: 0, Size: 2, Endpoint: []byte("ep")}); err != nil {
		t.Fatal(err)
	}
	if err := rc.fc.send(&msgGather{Seq: 0, Kind: kindBarrier}); err != nil {
		t.Fatal(err)
	}
	rc.drain() // the server closes the connection
	if v := metric(t, ts.reg, "xrc_bootstrap_server_bad_messages_total", "reason", "unexpected"); v != 1 {
		t.Fatalf("bad_messages_total{reason=unexpected} = %v", v)
	}
	_, err := Join(testCtx(t), ts.Addr(), testKey, Member{Rank: 1}, 2, ClientConfig{})
	if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 0 was lost") || !strings.Contains(err.Error(), "before every rank joined") {
		t.Fatalf("the other rank's Join: %v", err)
	}
}

// TestCollectiveRepliesChecked: a server (bad, or of another version)
// that answers an AllGather with no records, or a Barrier with records,
// ends the client with a protocol error. AllGather used to return no
// records and no error, and comm.Init then indexed them by rank.
func TestCollectiveRepliesChecked(t *testing.T) {
	for _, kind := range []uint8{kindAllGather, kindBarrier} {
		t.Run(kindName(kind), func(t *testing.T) {
			addr := fakeServer(t, 2, func(fc *frameConn) error {
				typ, p, err := fc.read(maxFromRank)
				if err != nil {
					return err
				}
				g, err := expect[*msgGather](typ, p, tGather)
				if err != nil {
					return err
				}
				reply := &msgGathered{Seq: g.Seq}
				if kind == kindBarrier {
					reply.Recs = [][]byte{nil, nil}
				}
				return fc.send(reply)
			})
			ctx := testCtx(t)
			c, err := Join(ctx, addr, testKey, Member{Rank: 0}, 2, ClientConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if kind == kindAllGather {
				_, err = c.AllGather(ctx, []byte("mine"))
			} else {
				err = c.Barrier(ctx)
			}
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("%s answered wrongly: %v", kindName(kind), err)
			}
			if err := c.Barrier(ctx); !errors.Is(err, ErrProtocol) {
				t.Fatalf("the client goes on after the bad reply: %v", err)
			}
		})
	}
}

// fakeServer accepts one rank of a job of size, runs the handshake and
// sends the member table, then runs then on the connection.
func fakeServer(t *testing.T, size int, then func(fc *frameConn) error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	go func() {
		defer close(done)
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		m := newClientMetrics(nil)
		fc := newFrameConn(nc, m.bytesIn, m.bytesOut)
		if _, err := acceptHandshake(fc, testKey, rand.Reader); err != nil {
			t.Error(err)
			return
		}
		ready := msgReady{}
		for r := range size {
			ready.Members = append(ready.Members, Member{Rank: r})
		}
		if err := fc.send(&ready); err != nil {
			t.Error(err)
			return
		}
		if err := then(fc); err != nil {
			t.Error(err)
			return
		}
		// Until the client has read it all and closed.
		fc.read(maxFromRank)
	}()
	return ln.Addr().String()
}

// TestAcceptRetried: an accept that fails for want of descriptors is
// tried again after a pause, as net/http does; the server used to close,
// and every rank registered lost it.
func TestAcceptRetried(t *testing.T) {
	srv, err := Listen(t.Context(), "127.0.0.1:0", ServerConfig{Size: 2, Key: testKey, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	srv.ln = &failingListener{Listener: srv.ln, fails: 3}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background()) }()
	cs := joinAll(t, srv.Addr(), 2)
	each(t, cs, func(r int, c *Client) error { return c.Barrier(testCtx(t)) })
	select {
	case err := <-served:
		t.Fatalf("Serve ended: %v", err)
	default:
	}
}

// failingListener fails its first accepts as a process out of
// descriptors does.
type failingListener struct {
	net.Listener
	fails int
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.fails > 0 {
		l.fails--
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestRequestRepliesChecked: a server that answers a get with a put's
// answer (here one saying the key exists), or a put with a get's answer,
// is broken: the call fails with a protocol error, and so does the client
// afterwards. Get returned an empty value and no error, and Put succeeded.
func TestRequestRepliesChecked(t *testing.T) {
	for _, get := range []bool{true, false} {
		t.Run(map[bool]string{true: "get", false: "put"}[get], func(t *testing.T) {
			addr := fakeServer(t, 1, func(fc *frameConn) error {
				typ, p, err := fc.read(maxFromRank)
				if err != nil {
					return err
				}
				m, err := decodeMessage(typ, p)
				if err != nil {
					return err
				}
				switch m := m.(type) {
				case *msgGet:
					return fc.send(&msgPutDone{ID: m.ID, Err: "the key already holds a different value"})
				case *msgPut:
					return fc.send(&msgGot{ID: m.ID, Val: []byte("value")})
				}
				return fmt.Errorf("the client sent a %v", typ)
			})
			ctx := testCtx(t)
			c, err := Join(ctx, addr, testKey, Member{Rank: 0}, 1, ClientConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if get {
				var v []byte
				v, err = c.Get(ctx, "k")
				if err == nil {
					t.Fatalf("get answered by a put's answer: %q, no error", v)
				}
			} else {
				err = c.Put(ctx, "k", []byte("v"))
			}
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("answered wrongly: %v, want a protocol error", err)
			}
			if err := c.Barrier(ctx); !errors.Is(err, ErrProtocol) {
				t.Fatalf("the client goes on after the bad reply: %v", err)
			}
		})
	}
}
