package bootstrap

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestManyRanks(t *testing.T) {
	const n = 64
	ts := startServer(t, ServerConfig{Size: n})
	cs := joinAll(t, ts.Addr(), n)
	if ts.Joined() != n {
		t.Fatalf("Joined() = %d", ts.Joined())
	}
	ctx := testCtx(t)
	each(t, cs, func(r int, c *Client) error {
		if c.Rank() != r || c.Size() != n {
			return fmt.Errorf("rank %d: Rank %d Size %d", r, c.Rank(), c.Size())
		}
		for i, m := range c.Members() {
			if m.Rank != i || m.Node != i/4 || m.LocalRank != i%4 || string(m.Endpoint) != fmt.Sprint("ep-", i) {
				return fmt.Errorf("rank %d: member %d is %+v", r, i, m)
			}
		}
		for round := range 3 {
			recs, err := c.AllGather(ctx, fmt.Appendf(nil, "rec %d of %d", round, r))
			if err != nil {
				return err
			}
			for i, rec := range recs {
				if want := fmt.Sprintf("rec %d of %d", round, i); string(rec) != want {
					return fmt.Errorf("rank %d round %d: record %d is %q, want %q", r, round, i, rec, want)
				}
			}
			if err := c.Barrier(ctx); err != nil {
				return err
			}
		}
		// Get a key before its rank may have put it.
		peer := (r + 1) % n
		got := make(chan error, 1)
		go func() {
			v, err := c.Get(ctx, fmt.Sprint("key-", peer))
			if err == nil && string(v) != fmt.Sprint("val-", peer) {
				err = fmt.Errorf("rank %d: got %q for key-%d", r, v, peer)
			}
			got <- err
		}()
		if err := c.Put(ctx, fmt.Sprint("key-", r), fmt.Appendf(nil, "val-%d", r)); err != nil {
			return err
		}
		if err := <-got; err != nil {
			return err
		}
		// An empty record is a record.
		recs, err := c.AllGather(ctx, nil)
		if err != nil {
			return err
		}
		if len(recs) != n || len(recs[0]) != 0 {
			return fmt.Errorf("rank %d: empty all-gather gave %q", r, recs)
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		return c.Close()
	})
	if err := ts.result(t); err != nil {
		t.Fatalf("Serve after every rank left: %v", err)
	}
	if v := metric(t, ts.reg, "xrc_bootstrap_server_joins_total"); v != n {
		t.Errorf("joins_total = %v", v)
	}
	if v := metric(t, ts.reg, "xrc_bootstrap_server_received_bytes_total"); v == 0 {
		t.Error("no bytes counted")
	}
	if v := metric(t, ts.reg, "xrc_bootstrap_server_aborts_total"); v != 0 {
		t.Errorf("aborts_total = %v", v)
	}
	for _, c := range cs {
		if !errors.Is(c.Err(), ErrClosed) {
			t.Fatalf("rank %d: Err() = %v after Close", c.Rank(), c.Err())
		}
		if err := c.Barrier(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("Barrier after Close: %v", err)
		}
	}
}

func TestWrongKey(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 2})
	ctx := testCtx(t)
	bad := bytes.Repeat([]byte{7}, 32)
	_, err := Join(ctx, ts.Addr(), bad, Member{Rank: 0}, 2, ClientConfig{})
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("Join with a wrong key: %v", err)
	}
	t.Log(err)

	// A client that goes on with a wrong proof is refused by the server.
	rc := dialRaw(t, ts.Addr())
	hello := msgHello{Version: protoVersion}
	copy(hello.Magic[:], magic)
	if err := rc.fc.send(&hello); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rc.fc.read(maxPreAuth); err != nil {
		t.Fatal(err)
	}
	if err := rc.fc.send(&msgAuth{Proof: proof(bad, labelClient, nil, nil)}); err != nil {
		t.Fatal(err)
	}
	if got := rc.drain(); len(got) != 1 || got[0] != tReject {
		t.Fatalf("server sent %v to a wrong proof", got)
	}
	if v := metric(t, ts.reg, "xrc_bootstrap_server_auth_failures_total"); v < 1 {
		t.Fatalf("auth_failures_total = %v", v)
	}
	if ts.Joined() != 0 {
		t.Fatalf("Joined() = %d", ts.Joined())
	}
}

func TestImpostorServer(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 1, Key: bytes.Repeat([]byte{9}, 32)})
	_, err := Join(testCtx(t), ts.Addr(), testKey, Member{Rank: 0}, 1, ClientConfig{})
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "server") {
		t.Fatalf("Join to a server with another key: %v", err)
	}
}

func TestRegisterRejected(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 2})
	register := func(m msgRegister) error {
		rc := dialRaw(t, ts.Addr())
		rc.authenticate(t, testKey)
		if err := rc.fc.send(&m); err != nil {
			t.Fatal(err)
		}
		typ, p, err := rc.fc.read(maxFromServer)
		if err != nil {
			t.Fatal(err)
		}
		rej, err := expect[*msgReject](typ, p, tReject)
		if err != nil {
			t.Fatal(err)
		}
		return rejectError(rej)
	}
	for _, tc := range []struct {
		m    msgRegister
		want string
	}{
		{msgRegister{Rank: 2, Size: 2}, "rank 2 is out of range"},
		{msgRegister{Rank: 0, Size: 3}, "the job has 3 ranks; it has 2"},
	} {
		err := register(tc.m)
		if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v", tc.m, err)
		}
	}

	// Rank 0 registers (and waits for rank 1); a second rank 0 is refused.
	first := dialRaw(t, ts.Addr())
	first.authenticate(t, testKey)
	if err := first.fc.send(&msgRegister{Rank: 0, Size: 2}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return ts.Joined() == 1 })
	_, err := Join(testCtx(t), ts.Addr(), testKey, Member{Rank: 0}, 2, ClientConfig{})
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "rank 0 is already registered") {
		t.Fatalf("a second rank 0: %v", err)
	}
	if v := metric(t, ts.reg, "xrc_bootstrap_server_rejected_total"); v != 3 {
		t.Fatalf("rejected_total = %v", v)
	}
}

func TestJoinArguments(t *testing.T) {
	ctx := testCtx(t)
	for _, tc := range []struct {
		key  []byte
		me   Member
		size int
	}{
		{testKey[:8], Member{}, 1},
		{testKey, Member{Rank: 1}, 1},
		{testKey, Member{Rank: -1}, 1},
		{testKey, Member{}, 0},
		{testKey, Member{Endpoint: make([]byte, MaxRecord+1)}, 1},
	} {
		if _, err := Join(ctx, "127.0.0.1:1", tc.key, tc.me, tc.size, ClientConfig{}); err == nil {
			t.Errorf("Join(%d-byte key, rank %d, size %d) worked", len(tc.key), tc.me.Rank, tc.size)
		}
	}
	if _, err := Listen(ctx, "127.0.0.1:0", ServerConfig{Size: 1, Key: testKey[:15]}); err == nil {
		t.Error("Listen with a short key worked")
	}
}
