package bootstrap

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// What a rank can make the server hold besides answers: gets waiting for
// keys nobody has put, and its parts of collectives the other ranks have
// not entered yet. A rank may hold up to the bounds (maxWaitingGets,
// maxWaitingGetBytes, maxCollectivesAhead) and the job goes on; a request
// past them aborts the job naming the rank and why, and frees what it
// held. The server used to hold whatever a rank sent, until it ran out
// of memory and took every rank's job with it.

// limitJob starts a job of two: rank 0 is a raw connection, registered
// and past the member table, rank 1 a client.
func limitJob(t *testing.T) (*testServer, *rawConn, *Client) {
	t.Helper()
	ts := startServer(t, ServerConfig{Size: 2})
	rc := dialRaw(t, ts.Addr())
	rc.authenticate(t, testKey)
	if err := rc.fc.send(&msgRegister{Rank: 0, Size: 2, Endpoint: []byte("ep-0")}); err != nil {
		t.Fatal(err)
	}
	c1, err := Join(testCtx(t), ts.Addr(), testKey, Member{Rank: 1, Endpoint: []byte("ep-1")}, 2, ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c1.Close() })
	if _, err := expectOrReject[*msgReady](rc.fc, maxFromServer, tReady); err != nil {
		t.Fatal(err)
	}
	return ts, rc, c1
}

// sendAll writes the frames of ms to rc at once, in a goroutine: the
// server reads them as they come. The returned channel gives the write's
// error.
func sendAll(rc *rawConn, ms ...message) <-chan error {
	var b []byte
	for _, m := range ms {
		b = appendFrame(b, m)
	}
	done := make(chan error, 1)
	go func() { done <- rc.fc.write(b) }()
	return done
}

// waitingGets returns the number of rank's gets the server holds waiting,
// the bytes of their keys, and the job's abort, if any.
func waitingGets(ts *testServer, rank int) (n, keyBytes int, abort *AbortError) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	c := ts.members[rank]
	for _, k := range c.gets {
		keyBytes += len(k)
	}
	return len(c.gets), keyBytes, ts.abort
}

// gotTo reports whether the server holds n of rank's gets waiting, or
// the job was aborted; cheaper than waitingGets, for polling.
func gotTo(ts *testServer, rank int, n uint64) func() bool {
	return func() bool {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		return uint64(len(ts.members[rank].gets)) == n || ts.abort != nil
	}
}

// gathersHeld returns the number of collectives under way that hold
// rank's part, and the job's abort, if any.
func gathersHeld(ts *testServer, rank int) (n int, abort *AbortError) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, g := range ts.gathers {
		if g.have[rank] {
			n++
		}
	}
	return n, ts.abort
}

// aborted returns the job's abort, nil while it runs.
func aborted(ts *testServer) *AbortError {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.abort
}

// gets makes the gets of ids [from, to) of the keys key(id).
func gets(from, to uint64, key func(id uint64) string) []message {
	var ms []message
	for id := from; id < to; id++ {
		ms = append(ms, &msgGet{ID: id, Key: key(id)})
	}
	return ms
}

// readAbort reads rc's frames until the abort, skipping others, and
// returns it.
func readAbort(t *testing.T, rc *rawConn) *msgAbort {
	t.Helper()
	for {
		typ, p, err := rc.fc.read(maxFromServer)
		if err != nil {
			t.Fatalf("reading until the abort: %v", err)
		}
		if typ == tAbort {
			a, err := expect[*msgAbort](typ, p, tAbort)
			if err != nil {
				t.Fatal(err)
			}
			return a
		}
	}
}

// checkRefused checks that the job was aborted for rank 0 with a reason
// containing want, once (refusals_total), that rank 0 and rank 1 were
// told so, that rank 1's calls all fail with that error, and that the
// server ends with it once both are gone.
func checkRefused(t *testing.T, ts *testServer, rc *rawConn, c1 *Client, limit, want string) {
	t.Helper()
	ctx := testCtx(t)
	a := aborted(ts)
	if a == nil || a.Rank != 0 || !strings.Contains(a.Reason, want) {
		t.Fatalf("the job's abort: %v; want one naming rank 0 and saying %q", a, want)
	}
	t.Logf("abort: %v", a)
	if v := metric(t, ts.reg, "xrc_bootstrap_server_refused_requests_total", "limit", limit); v != 1 {
		t.Fatalf("refused_requests_total{limit=%q} = %v", limit, v)
	}
	if m := readAbort(t, rc); m.Rank != 0 || m.Reason != a.Reason {
		t.Fatalf("rank 0 was told: rank %d, %q", m.Rank, m.Reason)
	}
	select {
	case <-c1.Done():
	case <-time.After(long):
		t.Fatal("rank 1's client did not end")
	}
	for what, err := range map[string]error{
		"barrier": c1.Barrier(ctx),
		"put":     c1.Put(ctx, "after", []byte("v")),
		"get": func() error {
			_, err := c1.Get(ctx, "after")
			return err
		}(),
	} {
		var ae *AbortError
		if !errors.As(err, &ae) || ae.Rank != 0 || !ae.Blamed || !strings.Contains(ae.Reason, want) {
			t.Fatalf("rank 1's %s after the refusal: %v", what, err)
		}
	}
	rc.Close()
	var ae *AbortError
	if err := ts.result(t); !errors.As(err, &ae) || ae.Rank != 0 || !strings.Contains(err.Error(), "aborted because of rank 0: ") {
		t.Fatalf("Serve: %v", err)
	}
}

// TestWaitingGetsBounded: a rank may have maxWaitingGets gets waiting for
// keys nobody has put, and the job goes on: a put answers them all, and
// the ranks then take part in a barrier, a put and a get. One get more
// aborts the job, naming the rank, and frees its gets.
func TestWaitingGetsBounded(t *testing.T) {
	ts, rc, c1 := limitJob(t)
	ctx := testCtx(t)
	key := func(uint64) string { return "k" }

	// Up to the bound: held, and answered once the key is put.
	sent := sendAll(rc, gets(1, maxWaitingGets+1, key)...)
	waitFor(t, gotTo(ts, 0, maxWaitingGets))
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if a := aborted(ts); a != nil {
		t.Fatalf("%d gets waiting aborted the job: %v", maxWaitingGets, a)
	}
	if err := c1.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	for got := 0; got < maxWaitingGets; {
		m, err := expectOrReject[*msgGot](rc.fc, maxFromServer, tGot)
		if err != nil {
			t.Fatalf("after %d answers: %v", got, err)
		}
		if string(m.Val) != "v" {
			t.Fatalf("got %q", m.Val)
		}
		got++
	}
	barrier := make(chan error, 1)
	go func() { barrier <- c1.Barrier(ctx) }()
	if err := rc.fc.send(&msgGather{Seq: 0, Kind: kindBarrier}); err != nil {
		t.Fatal(err)
	}
	if _, err := expectOrReject[*msgGathered](rc.fc, maxFromServer, tGathered); err != nil {
		t.Fatal(err)
	}
	if err := <-barrier; err != nil {
		t.Fatal(err)
	}
	if v, err := c1.Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("get: %q, %v", v, err)
	}

	// Past it: the job aborts naming rank 0, and its gets are freed.
	n := uint64(maxWaitingGets + 1)
	never := func(id uint64) string { return fmt.Sprintf("never/%d", id) }
	sent = sendAll(rc, gets(1<<20, 1<<20+n, never)...)
	waitFor(t, gotTo(ts, 0, n))
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if k, _, a := waitingGets(ts, 0); a == nil {
		t.Fatalf("the server holds %d gets of rank 0 waiting, more than %d", k, maxWaitingGets)
	}
	if k, _, _ := waitingGets(ts, 0); k != 0 {
		t.Fatalf("after the abort the server still holds %d gets of rank 0", k)
	}
	checkRefused(t, ts, rc, c1, "waiting_gets", "gets waiting")
}

// TestWaitingGetKeysBounded: the keys of a rank's waiting gets may total
// maxWaitingGetBytes; a get more aborts the job, naming the rank.
func TestWaitingGetKeysBounded(t *testing.T) {
	ts, rc, c1 := limitJob(t)
	longKey := func(id uint64) string {
		k := fmt.Sprintf("%d/", id)
		return k + strings.Repeat("k", MaxKey-len(k))
	}
	n := uint64(maxWaitingGetBytes / MaxKey)
	sent := sendAll(rc, gets(1, n+1, longKey)...)
	waitFor(t, gotTo(ts, 0, n))
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if _, b, a := waitingGets(ts, 0); a != nil || b != maxWaitingGetBytes {
		t.Fatalf("gets of keys of %d bytes in all: held %d bytes, abort %v", maxWaitingGetBytes, b, a)
	}
	sent = sendAll(rc, &msgGet{ID: n + 1, Key: "one more"})
	waitFor(t, gotTo(ts, 0, n+1))
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if _, b, a := waitingGets(ts, 0); a == nil {
		t.Fatalf("the server holds %d bytes of keys of rank 0's gets, more than %d", b, maxWaitingGetBytes)
	}
	checkRefused(t, ts, rc, c1, "waiting_get_bytes", "keys")
}

// TestCollectivesAheadBounded: a rank may enter maxCollectivesAhead
// collectives before the other ranks, and the job goes on: the others
// catch up and every collective completes. One more aborts the job,
// naming the rank, and frees its parts.
func TestCollectivesAheadBounded(t *testing.T) {
	ts, rc, c1 := limitJob(t)
	ctx := testCtx(t)
	rec := bytes.Repeat([]byte("r"), 1<<10)
	ahead := func(from, to uint64) []message {
		var ms []message
		for seq := from; seq < to; seq++ {
			ms = append(ms, &msgGather{Seq: seq, Kind: kindAllGather, Rec: rec})
		}
		return ms
	}

	// Up to the bound: held, and completed once rank 1 catches up.
	sent := sendAll(rc, ahead(0, maxCollectivesAhead)...)
	waitFor(t, func() bool { n, a := gathersHeld(ts, 0); return n == maxCollectivesAhead || a != nil })
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if a := aborted(ts); a != nil {
		t.Fatalf("%d collectives ahead aborted the job: %v", maxCollectivesAhead, a)
	}
	for seq := range maxCollectivesAhead {
		recs, err := c1.AllGather(ctx, []byte("mine"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(recs[0], rec) || string(recs[1]) != "mine" {
			t.Fatalf("collective %d: %q", seq, recs)
		}
		m, err := expectOrReject[*msgGathered](rc.fc, maxFromServer, tGathered)
		if err != nil || m.Seq != uint64(seq) {
			t.Fatalf("collective %d: rank 0 got %v, %v", seq, m, err)
		}
	}
	if n, _ := gathersHeld(ts, 0); n != 0 {
		t.Fatalf("%d collectives still held", n)
	}

	// Past it: the job aborts naming rank 0, and its parts are freed.
	from := uint64(maxCollectivesAhead)
	sent = sendAll(rc, ahead(from, from+maxCollectivesAhead+1)...)
	waitFor(t, func() bool { n, a := gathersHeld(ts, 0); return n == maxCollectivesAhead+1 || a != nil })
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if n, a := gathersHeld(ts, 0); a == nil {
		t.Fatalf("the server holds rank 0's part of %d collectives the others have not entered, more than %d", n, maxCollectivesAhead)
	}
	if n, _ := gathersHeld(ts, 0); n != 0 {
		t.Fatalf("after the abort the server still holds %d collectives", n)
	}
	checkRefused(t, ts, rc, c1, "collectives_ahead", "ahead")
}
