package bootstrap

import (
	"bytes"
	"fmt"
	"net"
	"runtime"
	"sync"
	"testing"
)

// TestFloodWithoutReading: a rank that keeps sending requests the server
// answers (gets of a key that exists) but never reads its socket does not
// make the server queue answers without bound: past maxQueued bytes the
// server stops reading that rank's requests, so the rank blocks itself on
// TCP. The other ranks go on (a barrier, a put, a get), and when the rank
// reads at last it gets every answer: nothing is dropped. The server used
// to read every request and queue every answer until it ran out of memory.
func TestFloodWithoutReading(t *testing.T) {
	const size = 3
	ts := startServer(t, ServerConfig{Size: size})
	ctx := testCtx(t)

	rc := slowRank0(t, ts, size)
	cs := make([]*Client, size) // cs[0] stays nil: rank 0 is rc
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := 1; r < size; r++ {
		wg.Go(func() {
			cs[r], errs[r] = Join(ctx, ts.Addr(), testKey, Member{Rank: r, Endpoint: fmt.Appendf(nil, "ep-%d", r)}, size, ClientConfig{})
		})
	}
	wg.Wait()
	for r := 1; r < size; r++ {
		if errs[r] != nil {
			t.Fatal(errs[r])
		}
		t.Cleanup(func() { cs[r].Close() })
	}
	ts.mu.Lock()
	c0 := ts.members[0]
	ts.mu.Unlock()

	// Rank 0 puts a value, takes part in a barrier, then asks for the
	// value n times and reads nothing: n answers (64 MiB) are far more
	// than maxQueued and what the sockets buffer.
	val := bytes.Repeat([]byte("v"), 64<<10)
	const n = 1024
	answer := len(appendFrame(nil, &msgGot{ID: 1, Val: val}))
	limit := maxQueued + answer + 1<<10 // one answer past the bound, and the barrier's result
	sent := make(chan error, 1)
	go func() {
		err := rc.fc.send(&msgPut{ID: 1, Key: "big", Val: val})
		if err == nil {
			err = rc.fc.send(&msgGather{Seq: 0, Kind: kindBarrier})
		}
		for id := uint64(2); err == nil && id < n+2; id++ {
			err = rc.fc.send(&msgGet{ID: id, Key: "big"})
		}
		sent <- err
	}()

	paused := func() float64 { return metric(t, ts.reg, "xrc_bootstrap_server_read_pauses_total") }
	waitFor(t, func() bool {
		_, peak := c0.queued()
		return peak > limit || paused() >= 1
	})
	if now, peak := c0.queued(); peak > limit {
		t.Fatalf("the server queued up to %d bytes (%d now) for a rank that reads nothing; the bound is %d", peak, now, limit)
	}

	// The other ranks are not held up by rank 0's flood.
	each(t, cs[1:], func(i int, c *Client) error {
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		key := fmt.Sprintf("k%d", c.Rank())
		if err := c.Put(ctx, key, []byte(key)); err != nil {
			return err
		}
		other := fmt.Sprintf("k%d", 3-c.Rank())
		v, err := c.Get(ctx, other)
		if err == nil && string(v) != other {
			err = fmt.Errorf("rank %d got %q for %q", c.Rank(), v, other)
		}
		return err
	})
	if now, peak := c0.queued(); peak > limit {
		t.Fatalf("the server queued up to %d bytes (%d now) for a rank that reads nothing; the bound is %d", peak, now, limit)
	}

	_, peak := c0.queued()
	t.Logf("queued for rank 0 at most: %d bytes (bound %d)", peak, maxQueued)

	// Rank 0 reads at last, and gets every answer.
	var ready, putDone, gathered int
	got := map[uint64]bool{}
	for ready+putDone+gathered+len(got) < 3+n {
		typ, p, err := rc.fc.read(maxFromServer)
		if err != nil {
			t.Fatalf("after %d ready, %d put-done, %d gathered, %d got: %v", ready, putDone, gathered, len(got), err)
		}
		m, err := decodeMessage(typ, p)
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *msgReady:
			ready++
		case *msgPutDone:
			putDone++
		case *msgGathered:
			gathered++
		case *msgGot:
			if m.ID < 2 || m.ID >= n+2 || got[m.ID] || !bytes.Equal(m.Val, val) {
				t.Fatalf("got %d (%d bytes): unexpected", m.ID, len(m.Val))
			}
			got[m.ID] = true
		default:
			t.Fatalf("unexpected %T", m)
		}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if ready != 1 || putDone != 1 || gathered != 1 {
		t.Fatalf("%d ready, %d put-done, %d gathered", ready, putDone, gathered)
	}
	if v := paused(); v < 1 {
		t.Fatalf("read_pauses_total = %v", v)
	}
	if err := rc.fc.send(&msgLeave{}); err != nil {
		t.Fatal(err)
	}
}

// TestWaitingGetsShareTheValue: the answers to gets waiting for a key are
// queued whatever the bound (they answer what the rank asked), so a rank
// that makes many gets of a key nobody has put, and reads nothing, must
// not make a put of that key copy the value once per get: the answers
// share the value's bytes. The server used to copy it into every answer,
// so n waiting gets of one large value cost n times its size.
func TestWaitingGetsShareTheValue(t *testing.T) {
	const size = 2
	ts := startServer(t, ServerConfig{Size: size})
	ctx := testCtx(t)

	rc := slowRank0(t, ts, size)
	c1, err := Join(ctx, ts.Addr(), testKey, Member{Rank: 1, Endpoint: []byte("ep-1")}, size, ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c1.Close() })

	const n = 256
	for id := uint64(1); id <= n; id++ {
		if err := rc.fc.send(&msgGet{ID: id, Key: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		return len(ts.gets["k"]) == n
	})

	val := bytes.Repeat([]byte("v"), 256<<10)
	before := heapInUse()
	if err := c1.Put(ctx, "k", val); err != nil {
		t.Fatal(err)
	}
	ts.mu.Lock() // the put's handling, which answers the gets, is over
	ts.mu.Unlock()
	grown := heapInUse() - before
	// The value itself, twice (the server's copy and the client's), and
	// the little each answer costs; copies would be 64 MiB.
	if grown > 16<<20 {
		t.Fatalf("answering %d gets of a value of %d bytes took %d MiB", n, len(val), grown>>20)
	}
	t.Logf("answering %d gets of a value of %d bytes took %d KiB", n, len(val), grown>>10)

	// Rank 0 reads at last, and gets every answer.
	got := map[uint64]bool{}
	for len(got) < n {
		typ, p, err := rc.fc.read(maxFromServer)
		if err != nil {
			t.Fatalf("after %d answers: %v", len(got), err)
		}
		m, err := decodeMessage(typ, p)
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *msgReady:
		case *msgGot:
			if m.ID < 1 || m.ID > n || got[m.ID] || !bytes.Equal(m.Val, val) {
				t.Fatalf("got %d (%d bytes): unexpected", m.ID, len(m.Val))
			}
			got[m.ID] = true
		default:
			t.Fatalf("unexpected %T", m)
		}
	}
	if err := rc.fc.send(&msgLeave{}); err != nil {
		t.Fatal(err)
	}
}

// heapInUse returns the bytes of live heap after a collection.
func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestGotFrame: gotFrame's two parts are msgGot's frame.
func TestGotFrame(t *testing.T) {
	for _, val := range [][]byte{nil, []byte("v"), bytes.Repeat([]byte("w"), 70000)} {
		head, body := gotFrame(7, val)
		want := appendFrame(nil, &msgGot{ID: 7, Val: val})
		if got := append(head, body...); !bytes.Equal(got, want) {
			t.Fatalf("gotFrame of %d bytes: % x, want % x", len(val), got[:min(len(got), 32)], want[:min(len(want), 32)])
		}
	}
}

// slowRank0 registers rank 0 of a job of size through a raw connection
// with a small socket buffer, so that the kernel holds little of what the
// server writes to it and answers it does not read overflow it many times
// over.
func slowRank0(t *testing.T, ts *testServer, size uint32) *rawConn {
	t.Helper()
	rc := dialRaw(t, ts.Addr())
	if err := rc.Conn.(*net.TCPConn).SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	rc.authenticate(t, testKey)
	if err := rc.fc.send(&msgRegister{Rank: 0, Size: size, Endpoint: []byte("ep-0")}); err != nil {
		t.Fatal(err)
	}
	return rc
}
