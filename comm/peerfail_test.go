package comm

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

// TestFailedPeerBacklog: rank 0's connection to rank 1 fails (rank 1's
// node drops every packet it sends, so nothing rank 0 sends is
// acknowledged) while frames for rank 1 wait in rank 0's backlog. The
// sends queued for rank 1 fail, and rank 0 still talks to rank 2. Before,
// the first frame that could not be sent failed every progress of rank 0:
// the queued sends never completed, and every call failed with rank 1's
// error. A rendezvous send to rank 1 fails too.
func TestFailedPeerBacklog(t *testing.T) {
	comms, devs := worldDevs(t, 3, layout{nodeOf: func(r int) int { return r }})
	devs[1].SetFaults(softhca.Faults{Loss: 1, Seed: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c0, c2 := comms[0], comms[2]
	// More frames than the QP toward rank 1 takes: the rest wait.
	var reqs []*Request
	for i := range 100 {
		r, err := c0.Isend(make([]byte, 200), 1, 7)
		if err != nil {
			t.Fatalf("isend %d: %v", i, err)
		}
		reqs = append(reqs, r)
	}
	// And a rendezvous send, whose announcement waits too: it completes
	// when rank 1 says it has the message, which it cannot now.
	big, err := c0.Isend(make([]byte, 1<<20), 1, 8)
	if err != nil {
		t.Fatal(err)
	}
	reqs = append(reqs, big)
	// The QP fails after its retries, some seconds on.
	failed := 0
	for i, r := range reqs {
		for {
			done, _, err := r.Test()
			if done {
				if err != nil {
					failed++
				}
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("send %d to the unreachable rank 1 never completed", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if failed == 0 {
		t.Fatal("no send to the unreachable rank 1 failed")
	}
	if _, _, err := big.Test(); err == nil {
		t.Fatal("the rendezvous send to the unreachable rank 1 succeeded")
	}
	t.Logf("%d of %d sends to rank 1 failed", failed, len(reqs))
	errc := make(chan error, 1)
	go func() {
		for i := range 5 {
			if err := c2.Send(ctx, []byte{byte(i)}, 0, 3); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for i := range 5 {
		b := make([]byte, 1)
		if _, err := c0.Recv(ctx, b, 2, 3); err != nil || b[0] != byte(i) {
			t.Fatalf("rank 0: receive %d from rank 2: %v, %d", i, err, b[0])
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(fmt.Errorf("rank 2: %w", err))
	}
}

// TestLazyPeerGoneBeforeReady: with lazy connection, rank 0 sends to rank
// 1 on another node, which makes no call and so never answers rank 0's
// hello: the send waits for rank 1's ready. Rank 1 then leaves the job
// without finalizing, and the rendezvous server aborts the job, as it does
// when a rank's process dies (here rank 1's client aborts the job, which
// does not exit the test): rank 0's send fails with the job's end instead
// of waiting for a ready that will not come, and both ranks finalize.
func TestLazyPeerGoneBeforeReady(t *testing.T) {
	for _, tr := range []string{"rc", "xrc"} {
		t.Run(tr, func(t *testing.T) {
			comms := worldOn(t, 2, layout{nodeOf: func(r int) int { return r }, connect: "lazy", transport: tr})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			req, err := comms[0].Isend([]byte("hello"), 1, 5)
			if err != nil {
				t.Fatal(err)
			}
			for range 100 {
				if done, _, err := req.Test(); done {
					t.Fatalf("the send completed (%v) though rank 1 never answered the hello", err)
				}
				time.Sleep(2 * time.Millisecond)
			}
			if rep := comms[0].Report(); rep.RCQPs+rep.INIQPs == 0 {
				t.Fatalf("rank 0 made no QP for rank 1: %+v", rep)
			}
			comms[1].boot.Abort(ctx, "gone")
			_, err = req.Wait(ctx)
			if !errors.Is(err, bootstrap.ErrAborted) || ctx.Err() != nil {
				t.Fatalf("the send to rank 1, gone before its ready: %v, want the job's abort", err)
			}
			t.Logf("the send: %v", err)
			for r, c := range comms {
				if err := c.Finalize(ctx); ctx.Err() != nil {
					t.Fatalf("rank %d: finalize after the abort did not return: %v", r, err)
				}
			}
		})
	}
}

// TestRecvFromFailedPeer: rank 0's connection to rank 1 fails (rank 1's
// node drops every packet it sends, so nothing rank 0 sends is
// acknowledged, and the QP, over RC, or the INI QP toward rank 1's node,
// over XRC, runs out of retries). A receive from rank 1 posted before,
// and one posted after, fail with the QP's error. Before, rc and xrc never
// told comm (transport.PeerFailureHandler): the receives waited until
// their context ended, for ever with context.Background().
func TestRecvFromFailedPeer(t *testing.T) {
	// The guard: the QP fails after its retries, some seconds on.
	earlyRecv(t, func(t *testing.T, ctx context.Context, c0 *Comm, devs map[int]*softhca.Device, early *Request) {
		devs[1].SetFaults(softhca.Faults{Loss: 1, Seed: 1})
		send, err := c0.Isend([]byte("x"), 1, 7)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = early.Wait(ctx)
		if err == nil || ctx.Err() != nil {
			t.Fatalf("the receive from rank 1, whose connection failed: %v after %v; want the connection's error",
				err, time.Since(start))
		}
		if !errors.Is(err, verbs.WCRetryExcErr) {
			t.Errorf("the receive from rank 1: %v; want it to wrap %v", err, verbs.WCRetryExcErr)
		}
		t.Logf("after %v: %v", time.Since(start), err)
		if _, err := c0.Recv(ctx, make([]byte, 8), 1, 10); err == nil || ctx.Err() != nil {
			t.Fatalf("a receive from rank 1 posted after its failure: %v", err)
		}
		if _, err := send.Wait(ctx); ctx.Err() != nil {
			t.Fatalf("the send to rank 1 never completed: %v", err)
		}
	})
}

// earlyRecv runs test over rc and over xrc, on a job of two ranks on two
// nodes where rank 0 has posted a receive from rank 1 (early), with a
// context that ends after 30 seconds, the tests' guard.
func earlyRecv(t *testing.T, test func(t *testing.T, ctx context.Context, c0 *Comm, devs map[int]*softhca.Device, early *Request)) {
	for _, tr := range []string{"rc", "xrc"} {
		t.Run(tr, func(t *testing.T) {
			comms, devs := worldDevs(t, 2, layout{nodeOf: func(r int) int { return r }, transport: tr})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			early, err := comms[0].Irecv(make([]byte, 8), 1, 9)
			if err != nil {
				t.Fatal(err)
			}
			test(t, ctx, comms[0], devs, early)
		})
	}
}

// TestRecvDeviceGone: rank 0's device goes away (IBV_EVENT_DEVICE_FATAL)
// while a receive from rank 1, on another node, is posted and nothing of
// rank 0's is in flight: the receive fails with an error wrapping the
// event, as does one posted later, while rank 0 sleeps between its polls
// (the transport arms nothing on a dead device). Before, the event was
// only logged and the receive waited for ever.
func TestRecvDeviceGone(t *testing.T) {
	earlyRecv(t, func(t *testing.T, ctx context.Context, c0 *Comm, devs map[int]*softhca.Device, early *Request) {
		if err := devs[0].Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := early.Wait(ctx); !errors.Is(err, verbs.EventDeviceFatal) || ctx.Err() != nil {
			t.Fatalf("the receive from rank 1 after rank 0's device went away: %v; want it to wrap %v", err, verbs.EventDeviceFatal)
		}
		if _, err := c0.Recv(ctx, make([]byte, 8), 1, 10); !errors.Is(err, verbs.EventDeviceFatal) || ctx.Err() != nil {
			t.Fatalf("a receive from rank 1 posted after: %v", err)
		}
	})
}
