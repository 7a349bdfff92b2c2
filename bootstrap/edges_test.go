package bootstrap

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// TestAbortBeforeReady: an abort before every rank joined (the launcher's
// Server.Abort) reaches the ranks waiting in Join as the *AbortError, not
// as a protocol error ("an abort message where a ready belongs").
func TestAbortBeforeReady(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 2})
	ctx := testCtx(t)
	errc := make(chan error, 1)
	go func() {
		_, err := Join(ctx, ts.Addr(), testKey, Member{Rank: 0}, 2, ClientConfig{})
		errc <- err
	}()
	waitFor(t, func() bool { return ts.Joined() == 1 })
	ts.Abort("launcher gives up")
	err := <-errc
	var ae *AbortError
	if !errors.As(err, &ae) || !errors.Is(err, ErrAborted) {
		t.Fatalf("Join while the job is aborted: %v (ErrProtocol: %v)", err, errors.Is(err, ErrProtocol))
	}
}

// TestRankLostBeforeReady: the same when another rank is lost before
// every rank joined; the error names it, as lost.
func TestRankLostBeforeReady(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 3})
	ctx := testCtx(t)
	errc := make(chan error, 1)
	go func() {
		_, err := Join(ctx, ts.Addr(), testKey, Member{Rank: 0}, 3, ClientConfig{})
		errc <- err
	}()
	waitFor(t, func() bool { return ts.Joined() == 1 })
	rc := dialRaw(t, ts.Addr())
	rc.authenticate(t, testKey)
	if err := rc.fc.send(&msgRegister{Rank: 1, Size: 3}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return ts.Joined() == 2 })
	rc.Close() // rank 1 crashes
	err := <-errc
	var ae *AbortError
	if !errors.As(err, &ae) || ae.Rank != 1 || !ae.Lost {
		t.Fatalf("rank 0's Join after rank 1 was lost: %v", err)
	}
}

// TestServeAfterEarlyLoss: after a rank is lost before every rank joined,
// the others are refused and never become members; Serve returns the
// *AbortError once every rank is accounted for (it waited for ranks that
// would never join, and xrcrun gave up waiting for the culprit).
func TestServeAfterEarlyLoss(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 2})
	ctx := testCtx(t)
	rc := dialRaw(t, ts.Addr())
	rc.authenticate(t, testKey)
	if err := rc.fc.send(&msgRegister{Rank: 0, Size: 2}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return ts.Joined() == 1 })
	rc.Close()
	waitFor(t, func() bool { ts.mu.Lock(); defer ts.mu.Unlock(); return ts.abort != nil })
	if _, err := Join(ctx, ts.Addr(), testKey, Member{Rank: 1}, 2, ClientConfig{}); !errors.Is(err, ErrAborted) {
		t.Fatalf("Join: %v", err)
	}
	select {
	case err := <-ts.served:
		var ae *AbortError
		if !errors.As(err, &ae) || ae.Rank != 0 {
			t.Fatalf("Serve: %v, want rank 0's abort", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("every rank is gone (rank 0 lost, rank 1 refused) but Serve has not returned")
	}
}

// TestAbandonedGets: a Get whose context ends tells the server to forget
// it (with the client's next frame). Before, every abandoned Get stayed on
// the server, which sent each a copy of the value once it was put: 64
// timed-out Gets then one Put of 1 MiB made it send 65 MiB.
func TestAbandonedGets(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 2})
	cs := joinAll(t, ts.Addr(), 2)
	ctx := testCtx(t)
	const tries = 64
	for range tries { // poll with a timeout, as "wait a while for the key" code does
		gctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		_, err := cs[0].Get(gctx, "k")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
	}
	before := metric(t, ts.reg, "xrc_bootstrap_server_sent_bytes_total")
	if err := cs[1].Put(ctx, "k", make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if _, err := cs[0].Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return metric(t, ts.reg, "xrc_bootstrap_server_sent_bytes_total")-before >= 1<<20 })
	time.Sleep(100 * time.Millisecond) // copies for abandoned Gets would go now
	if sent := metric(t, ts.reg, "xrc_bootstrap_server_sent_bytes_total") - before; sent > 4<<20 {
		t.Fatalf("one Put of 1 MiB and one live Get made the server send %.0f MiB (%d abandoned Gets)", sent/(1<<20), tries)
	}
}

// TestGetsOfLeavingRank: a rank that closes while a Get waits leaves no
// getter behind on the server.
func TestGetsOfLeavingRank(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 2})
	cs := joinAll(t, ts.Addr(), 2)
	ctx := testCtx(t)
	errc := make(chan error, 1)
	go func() {
		_, err := cs[0].Get(ctx, "never")
		errc <- err
	}()
	waitFor(t, func() bool { ts.mu.Lock(); defer ts.mu.Unlock(); return len(ts.gets["never"]) == 1 })
	cs[0].Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("Get when its client closed: %v", err)
	}
	waitFor(t, func() bool { ts.mu.Lock(); defer ts.mu.Unlock(); return len(ts.gets) == 0 })
}

// TestExpiredContextWaitingToWrite: a call whose context ends while it
// waits for another call's write returns the context's error and leaves
// the client working. Before, its write started with a deadline in the
// past, was cut, and ended the client with ErrLost.
func TestExpiredContextWaitingToWrite(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 2})
	cs := joinAll(t, ts.Addr(), 2)
	c := cs[0]
	for i := range 20 {
		c.wmu.Lock() // another call's long write
		pctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		errc := make(chan error, 1)
		go func() { errc <- c.Put(pctx, "k", make([]byte, 4<<20)) }()
		<-pctx.Done()
		time.Sleep(5 * time.Millisecond)
		c.wmu.Unlock()
		err := <-errc
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("try %d: Put: %v", i, err)
		}
		if err := c.Err(); err != nil {
			t.Fatalf("try %d: the client ended because one Put's context ended before it was sent: %v", i, err)
		}
	}
}

// TestCloseBehindStuckWrite: Close returns even while another call's write
// is stuck (a server that stopped reading); it waited for it forever.
func TestCloseBehindStuckWrite(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	addr := fakeServer(t, 2, func(fc *frameConn) error { <-stop; return nil }) // never reads
	ctx := testCtx(t)
	c, err := Join(ctx, addr, testKey, Member{Rank: 0}, 2, ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { c.AllGather(context.Background(), make([]byte, 32<<20)) })
	time.Sleep(500 * time.Millisecond) // the write fills the socket buffers and blocks
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case <-closed:
	case <-time.After(4 * closeTimeout):
		c.nc.Close() // let the test end
		<-closed
		wg.Wait()
		t.Fatalf("Close blocked for %v behind a stuck AllGather write", 4*closeTimeout)
	}
	wg.Wait()
}

// TestErrAfterBadReply: a server's message of the wrong kind ends the
// client with an error wrapping ErrLost, as Err documents, and
// ErrProtocol; it was a bare ErrProtocol.
func TestErrAfterBadReply(t *testing.T) {
	addr := fakeServer(t, 2, func(fc *frameConn) error {
		return fc.send(&msgGet{ID: 1, Key: "x"}) // a rank's message, from the server
	})
	c, err := Join(testCtx(t), addr, testKey, Member{Rank: 0}, 2, ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	if err := c.Err(); !errors.Is(err, ErrLost) || !errors.Is(err, ErrProtocol) {
		t.Fatalf("Err() = %v, want ErrLost and ErrProtocol", err)
	}
}

// TestJoinNoServer: a Join that cannot reach the server fails with ErrLost,
// as one whose server goes away does, so that callers match one error.
func TestJoinNoServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	_, err = Join(testCtx(t), addr, testKey, Member{Rank: 0}, 2, ClientConfig{})
	if !errors.Is(err, ErrLost) {
		t.Fatalf("join with no server: %v, want ErrLost", err)
	}
}
