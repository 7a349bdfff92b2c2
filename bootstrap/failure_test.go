package bootstrap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
)

func TestServerLost(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 2})
	cs := joinAll(t, ts.Addr(), 2)
	ctx := testCtx(t)
	got := make(chan error, 1)
	go func() {
		_, err := cs[0].Get(ctx, "never put")
		got <- err
	}()
	if err := ts.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, ErrLost) {
		t.Fatalf("a Get waiting when the server closed: %v", err)
	}
	for _, c := range cs {
		if err := c.Barrier(ctx); !errors.Is(err, ErrLost) {
			t.Fatalf("Barrier after the server closed: %v", err)
		}
		<-c.Done()
		if !errors.Is(c.Err(), ErrLost) {
			t.Fatalf("Err() = %v", c.Err())
		}
		if err := c.Put(ctx, "k", nil); !errors.Is(err, ErrLost) {
			t.Fatalf("Put after the server closed: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("Close after the server was lost: %v", err)
		}
	}
	if err := ts.result(t); err != nil {
		t.Fatalf("Serve after Close: %v", err)
	}
}

// How a job was aborted, for wantAbort.
const (
	howCalled = "called" // the rank called Abort
	howLost   = "lost"   // the rank was lost
	howBlamed = "blamed" // the server aborted the job because of the rank
)

// wantAbort checks that err is an *AbortError over rank, aborted as how
// says, with a reason containing reason.
func wantAbort(err error, rank int, how, reason string) error {
	var ae *AbortError
	if !errors.Is(err, ErrAborted) || !errors.As(err, &ae) || ae.Rank != rank || ae.Lost != (how == howLost) || ae.Blamed != (how == howBlamed) || !strings.Contains(ae.Reason, reason) {
		return fmt.Errorf("got %v, want an abort over rank %d (%s) for %q", err, rank, how, reason)
	}
	return nil
}

func TestAbortReachesAll(t *testing.T) {
	const n = 8
	ts := startServer(t, ServerConfig{Size: n})
	cs := joinAll(t, ts.Addr(), n)
	ctx := testCtx(t)
	each(t, cs, func(r int, c *Client) error {
		if r == 3 {
			return c.Abort(ctx, "boom")
		}
		// Everyone else waits in a collective rank 3 never joins.
		err := c.Barrier(ctx)
		<-c.Done()
		return errors.Join(wantAbort(err, 3, howCalled, "boom"), wantAbort(c.Err(), 3, howCalled, "boom"))
	})
	if err := wantAbort(cs[3].Err(), 3, howCalled, "boom"); err != nil {
		t.Fatal(err)
	}
	if err := wantAbort(ts.result(t), 3, howCalled, "boom"); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if !strings.Contains(cs[0].Err().Error(), "aborted by rank 3: boom") {
		t.Fatalf("message: %v", cs[0].Err())
	}
}

func TestServerAbort(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 3})
	cs := joinAll(t, ts.Addr(), 3)
	ctx := testCtx(t)
	ts.Abort("the launcher is done")
	each(t, cs, func(r int, c *Client) error {
		_, err := c.Get(ctx, "never put")
		return wantAbort(err, -1, howCalled, "the launcher is done")
	})
	// A rank that registers after the abort is refused.
	ts2 := startServer(t, ServerConfig{Size: 2})
	ts2.Abort("early")
	_, err := Join(ctx, ts2.Addr(), testKey, Member{Rank: 1}, 2, ClientConfig{})
	if !errors.Is(err, ErrAborted) {
		t.Fatalf("Join after an abort: %v", err)
	}
	if msg := err.Error(); strings.Count(msg, "job aborted") != 2 || !strings.Contains(msg, "before this rank joined") || !strings.Contains(msg, "early") {
		t.Fatalf("Join after an abort says %q", msg)
	}
}

func TestRankLost(t *testing.T) {
	const n = 4
	ts := startServer(t, ServerConfig{Size: n})
	cs := joinAll(t, ts.Addr(), n)
	ctx := testCtx(t)
	each(t, cs, func(r int, c *Client) error {
		if r == 2 {
			c.nc.Close() // a crash: no leave
			return nil
		}
		err := c.Barrier(ctx)
		return errors.Join(wantAbort(err, 2, howLost, "ended before it closed"), wantAbort(c.Err(), 2, howLost, ""))
	})
	err := ts.result(t)
	if err := wantAbort(err, 2, howLost, ""); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if !strings.Contains(err.Error(), "rank 2 was lost") {
		t.Fatalf("message: %v", err)
	}
}

func TestCloseBeforeCollective(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 3})
	cs := joinAll(t, ts.Addr(), 3)
	ctx := testCtx(t)
	each(t, cs, func(r int, c *Client) error { return c.Barrier(ctx) })
	if err := cs[1].Close(); err != nil {
		t.Fatal(err)
	}
	each(t, []*Client{cs[0], cs[2]}, func(r int, c *Client) error {
		return wantAbort(c.Barrier(ctx), 1, howBlamed, "closed before")
	})
}

func TestMismatchedCollective(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 2})
	cs := joinAll(t, ts.Addr(), 2)
	ctx := testCtx(t)
	each(t, cs, func(r int, c *Client) error {
		var err error
		if r == 0 {
			err = c.Barrier(ctx)
		} else {
			_, err = c.AllGather(ctx, []byte("x"))
		}
		// The server blames the rank that called second, either one.
		var ae *AbortError
		if !errors.As(err, &ae) || !ae.Blamed || !strings.Contains(err.Error(), "collective 0") ||
			!strings.Contains(err.Error(), fmt.Sprintf("aborted because of rank %d: ", ae.Rank)) {
			return fmt.Errorf("rank %d: %v", r, err)
		}
		return nil
	})
}

func TestPutConflictAndCancel(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 2})
	cs := joinAll(t, ts.Addr(), 2)
	ctx := testCtx(t)
	if err := cs[0].Put(ctx, "k", []byte("a")); err != nil {
		t.Fatal(err)
	}
	if err := cs[1].Put(ctx, "k", []byte("a")); err != nil {
		t.Fatalf("putting the same value again: %v", err)
	}
	if err := cs[1].Put(ctx, "k", []byte("b")); !errors.Is(err, ErrKeyExists) {
		t.Fatalf("putting another value: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := cs[0].Get(cctx, "later")
		got <- err
	}()
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled Get: %v", err)
	}
	// The client still works, and the abandoned Get's late reply is dropped.
	if err := cs[1].Put(ctx, "later", []byte("v")); err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		v, err := c.Get(ctx, "later")
		if err != nil || string(v) != "v" {
			t.Fatalf("Get: %q, %v", v, err)
		}
		if v, err := c.Get(ctx, "k"); err != nil || string(v) != "a" {
			t.Fatalf("Get: %q, %v", v, err)
		}
	}
	each(t, cs, func(r int, c *Client) error { return c.Barrier(ctx) })
}

// frame builds a raw frame of type t with payload p.
func frame(t msgType, p []byte) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{byte(t)}, uint32(len(p))), p...)
}

func TestGarbledConnections(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 2})
	good := appendFrame(nil, &msgHello{Magic: [4]byte{'X', 'R', 'C', 'B'}, Version: protoVersion})
	badMagic := appendFrame(nil, &msgHello{Magic: [4]byte{'H', 'T', 'T', 'P'}, Version: protoVersion})
	badVersion := appendFrame(nil, &msgHello{Magic: [4]byte{'X', 'R', 'C', 'B'}, Version: 99})
	for _, tc := range []struct {
		name   string
		send   []byte
		reason string
	}{
		{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "unknown_type"},
		{"zero type", make([]byte, 64), "unknown_type"},
		{"huge", []byte{byte(tHello), 0x40, 0, 0, 0}, "too_large"},
		{"over the pre-auth limit", frame(tRegister, make([]byte, maxPreAuth+1)), "too_large"},
		{"truncated payload", good[:20], "truncated"},
		{"truncated header", good[:3], "truncated"},
		{"long hello", frame(tHello, append(good[headerLen:], 0)), "malformed"},
		{"short hello", frame(tHello, good[headerLen:headerLen+10]), "malformed"},
		{"auth first", frame(tAuth, make([]byte, proofLen)), "unexpected"},
		{"bad magic", badMagic, "version"},
		{"bad version", badVersion, "version"},
	} {
		before := metric(t, ts.reg, "xrc_bootstrap_server_bad_messages_total", "reason", tc.reason)
		rc := dialRaw(t, ts.Addr())
		if _, err := rc.Write(tc.send); err != nil {
			t.Fatal(err)
		}
		rc.Conn.(*net.TCPConn).CloseWrite()
		rc.drain() // until the server hangs up
		if after := metric(t, ts.reg, "xrc_bootstrap_server_bad_messages_total", "reason", tc.reason); after != before+1 {
			t.Errorf("%s: bad_messages_total{reason=%q} went from %v to %v", tc.name, tc.reason, before, after)
		}
	}
	// The server still serves a job.
	cs := joinAll(t, ts.Addr(), 2)
	ctx := testCtx(t)
	each(t, cs, func(r int, c *Client) error {
		if _, err := c.AllGather(ctx, []byte{byte(r)}); err != nil {
			return err
		}
		return c.Barrier(ctx)
	})
	if v := metric(t, ts.reg, "xrc_bootstrap_server_aborts_total"); v != 0 {
		t.Fatalf("aborts_total = %v", v)
	}
}

func TestHandshakeTimeout(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 1, HandshakeTimeout: 1})
	rc := dialRaw(t, ts.Addr())
	rc.drain() // the server hangs up on a silent connection
	waitFor(t, func() bool {
		return metric(t, ts.reg, "xrc_bootstrap_server_bad_messages_total", "reason", "timeout") == 1
	})
}

func TestGarbledFromRank(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 2})
	ctx := testCtx(t)
	joined := make(chan error, 1)
	var c0 *Client
	go func() {
		var err error
		c0, err = Join(ctx, ts.Addr(), testKey, Member{Rank: 0}, 2, ClientConfig{})
		joined <- err
	}()
	rc := dialRaw(t, ts.Addr())
	rc.authenticate(t, testKey)
	if err := rc.fc.send(&msgRegister{Rank: 1, Size: 2}); err != nil {
		t.Fatal(err)
	}
	if err := <-joined; err != nil {
		t.Fatal(err)
	}
	defer c0.Close()
	if _, err := rc.Write(frame(tGather, []byte{1, 2, 3})); err != nil {
		t.Fatal(err)
	}
	if err := wantAbort(c0.Barrier(ctx), 1, howLost, "bad message"); err != nil {
		t.Fatal(err)
	}
	if v := metric(t, ts.reg, "xrc_bootstrap_server_bad_messages_total", "reason", "malformed"); v != 1 {
		t.Fatalf("bad_messages_total{reason=malformed} = %v", v)
	}
}

func TestJoinInterrupted(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 3})
	ctx := testCtx(t)
	cctx, cancel := context.WithCancel(ctx)
	joined := make(chan error, 2)
	go func() {
		_, err := Join(cctx, ts.Addr(), testKey, Member{Rank: 0}, 3, ClientConfig{})
		joined <- err
	}()
	waitFor(t, func() bool { return ts.Joined() == 1 })
	cancel()
	if err := <-joined; !errors.Is(err, context.Canceled) {
		t.Fatalf("Join cancelled while waiting for the others: %v", err)
	}
	// Rank 0 is lost, so the job is aborted; a late rank is refused.
	waitFor(t, func() bool { return metric(t, ts.reg, "xrc_bootstrap_server_aborts_total") == 1 })
	if _, err := Join(ctx, ts.Addr(), testKey, Member{Rank: 1}, 3, ClientConfig{}); !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 0 was lost") {
		t.Fatalf("Join after rank 0 was lost: %v", err)
	}

	ts2 := startServer(t, ServerConfig{Size: 2})
	go func() {
		_, err := Join(ctx, ts2.Addr(), testKey, Member{Rank: 1}, 2, ClientConfig{})
		joined <- err
	}()
	waitFor(t, func() bool { return ts2.Joined() == 1 })
	ts2.Close()
	if err := <-joined; !errors.Is(err, ErrLost) {
		t.Fatalf("Join when the server closed: %v", err)
	}
}
