package bootstrap

import (
	"bytes"
	"testing"
)

// TestLeaveBeforeFailedWrite: a rank that sends its leave and closes its
// socket without reading what the server still had to send it (answers
// to its own requests) has left cleanly: the job is not aborted. Before,
// the server's writer, failing to write to the closed socket, closed the
// connection under the reader, which lost the leave still unread (it
// waited for the queue to drain) and aborted the job: "rank 0 was lost".
func TestLeaveBeforeFailedWrite(t *testing.T) {
	const size = 2
	ts := startServer(t, ServerConfig{Size: size})
	ctx := testCtx(t)
	rc := slowRank0(t, ts, size)
	c1, err := Join(ctx, ts.Addr(), testKey, Member{Rank: 1}, size, ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	if typ, _, err := rc.fc.read(maxFromServer); err != nil || typ != tReady {
		t.Fatalf("rank 0's member table: %v %v", typ, err)
	}
	// An answer larger than maxQueued, so that the server reads no more
	// of rank 0's requests until it is written; then the leave, which
	// waits for the server to read it.
	val := bytes.Repeat([]byte("v"), 2*maxQueued)
	for _, m := range []message{&msgPut{ID: 1, Key: "big", Val: val}, &msgGet{ID: 2, Key: "big"}} {
		if err := rc.fc.send(m); err != nil {
			t.Fatal(err)
		}
	}
	ts.mu.Lock()
	c0 := ts.members[0]
	ts.mu.Unlock()
	waitFor(t, func() bool { q, _ := c0.queued(); return q > maxQueued })
	if err := rc.fc.send(&msgLeave{}); err != nil {
		t.Fatal(err)
	}
	rc.Close() // with the answer unread: the server's writes to it fail

	ts.mu.Lock()
	waitFor(t, func() bool { ts.mu.Unlock(); ts.mu.Lock(); return c0.gone })
	abort := ts.abort
	ts.mu.Unlock()
	if abort != nil {
		t.Fatalf("rank 0 sent its leave, then closed without reading: %v", abort)
	}
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ts.result(t); err != nil {
		t.Fatalf("Serve: %v", err)
	}
}
