package bootstrap

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

func clearEnv(t *testing.T) {
	for _, k := range []string{EnvRank, EnvSize, EnvLocalRank, EnvLocalSize, EnvNode, EnvNodes, EnvAddr,
		EnvKey, EnvJobID, EnvTransport, EnvConnect, EnvDevice} {
		t.Setenv(k, "")
	}
}

func TestFromEnvWorldOfOne(t *testing.T) {
	clearEnv(t)
	ctx := testCtx(t)
	c, env, err := FromEnv(ctx, ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if env.Size != 1 || c.Rank() != 0 || c.Size() != 1 || len(c.Members()) != 1 {
		t.Fatalf("env %+v, rank %d of %d, members %+v", env, c.Rank(), c.Size(), c.Members())
	}
	rec := []byte("mine")
	recs, err := c.AllGather(ctx, rec)
	if err != nil || len(recs) != 1 || string(recs[0]) != "mine" {
		t.Fatalf("AllGather: %q, %v", recs, err)
	}
	rec[0] = 'X'
	if string(recs[0]) != "mine" {
		t.Fatal("AllGather's result aliases the caller's record")
	}
	if err := c.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	go func() {
		v, err := c.Get(ctx, "k")
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	if err := c.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v := <-got; string(v) != "v" {
		t.Fatalf("Get: %q", v)
	}
	if err := c.Put(ctx, "k", []byte("w")); !errors.Is(err, ErrKeyExists) {
		t.Fatalf("Put of another value: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	if err := c.Barrier(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Barrier after Close: %v", err)
	}
}

func TestFromEnvAbortWorldOfOne(t *testing.T) {
	clearEnv(t)
	ctx := testCtx(t)
	c, _, err := FromEnv(ctx, ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Abort(ctx, "why not"); err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	if _, err := c.Get(ctx, "k"); wantAbort(err, 0, howCalled, "why not") != nil {
		t.Fatalf("Get after Abort: %v", err)
	}
}

func TestFromEnvJoins(t *testing.T) {
	ts := startServer(t, ServerConfig{Size: 1})
	clearEnv(t)
	env := Env{Rank: 0, Size: 1, LocalSize: 1, Nodes: 1, Addr: ts.Addr(), Key: testKey, JobID: "j"}
	for _, kv := range env.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	ctx := testCtx(t)
	c, got, err := FromEnv(ctx, ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got.JobID != "j" || hex.EncodeToString(got.Key) != hex.EncodeToString(testKey) {
		t.Fatalf("env %+v", got)
	}
	if err := c.Barrier(ctx); err != nil {
		t.Fatal(err)
	}

	t.Setenv(EnvKey, hex.EncodeToString(make([]byte, 16)))
	if _, _, err := FromEnv(ctx, ClientConfig{}); !errors.Is(err, ErrAuth) {
		t.Fatalf("FromEnv with the wrong key: %v", err)
	}
	t.Setenv(EnvKey, "zz")
	if _, _, err := FromEnv(ctx, ClientConfig{}); !errors.Is(err, ErrEnv) {
		t.Fatalf("FromEnv with a bad key: %v", err)
	}
}
