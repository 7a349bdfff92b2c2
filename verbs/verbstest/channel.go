package verbstest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xrcrun/xrc/internal/unix"

	"github.com/xrcrun/xrc/verbs"
)

// testTryEvent: a completion channel's descriptor is readable while an
// event waits; TryEvent takes it without waiting and finds none after it
// (nor with nothing armed); and with a GetEvent waiting beside it, every
// event goes to exactly one of the two, as comm's sleeping rank and the
// transports' watcher share a channel.
func testTryEvent(t *testing.T, env Env) {
	o := defaultOpts()
	o.channel = true
	p := newPair(t, env, o)
	ch := p.ch[1]
	if ch.FD() < 0 {
		t.Fatal("the channel has no descriptor")
	}
	if cq, err := ch.TryEvent(); cq != nil || err != nil {
		t.Fatalf("TryEvent with nothing armed: %v, %v", cq, err)
	}
	send := func(wrid uint64) {
		t.Helper()
		check(t, p.b.qp.PostRecv(&verbs.RecvWR{WRID: wrid, SG: []verbs.SGE{p.b.mr.SGE(0, 64)}}))
		check(t, p.a.qp.PostSend(&verbs.SendWR{WRID: wrid, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{p.a.mr.SGE(0, 8)}}))
		pollOne(t, p.a.cq, verbs.WCSuccess, wrid)
	}

	check(t, p.b.cq.RequestNotify(false))
	send(1)
	if !unix.ReadableWithin(ch.FD(), PollTimeout) {
		t.Fatal("the channel's descriptor is not readable after an armed completion")
	}
	if cq, err := ch.TryEvent(); cq != p.b.cq || err != nil {
		t.Fatalf("TryEvent after an armed completion: %v, %v", cq, err)
	}
	if cq, err := ch.TryEvent(); cq != nil || err != nil {
		t.Fatalf("TryEvent after the event was taken: %v, %v", cq, err)
	}
	pollOne(t, p.b.cq, verbs.WCSuccess, 1)

	// Beside a waiting GetEvent.
	ctx, cancel := context.WithCancel(context.Background())
	var waited atomic.Int32
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := ch.GetEvent(ctx); err != nil {
				if ctx.Err() != nil {
					err = nil
				}
				done <- err
				return
			}
			waited.Add(1)
		}
	}()
	const rounds = 20
	tried := 0
	for round := range rounds {
		check(t, p.b.cq.RequestNotify(false))
		send(uint64(100 + round))
		deadline := time.Now().Add(PollTimeout)
		for tried+int(waited.Load()) < round+1 {
			if time.Now().After(deadline) {
				cancel()
				t.Fatalf("round %d: the event reached neither TryEvent nor GetEvent", round)
			}
			cq, err := ch.TryEvent()
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			if cq != nil {
				tried++
			}
		}
		pollOne(t, p.b.cq, verbs.WCSuccess, uint64(100+round))
	}
	// No event is taken twice: none is left, and none comes unarmed.
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := tried + int(waited.Load()); got != rounds {
		t.Fatalf("%d events taken for %d armed completions (TryEvent %d, GetEvent %d)", got, rounds, tried, waited.Load())
	}
	t.Logf("TryEvent took %d events, GetEvent %d", tried, waited.Load())
}
