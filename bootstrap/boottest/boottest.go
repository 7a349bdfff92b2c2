// Package boottest runs a job's rendezvous inside a test: a server, and
// clients joined as the job's ranks, for the tests of packages built on
// bootstrap.
package boottest

import (
	"context"
	"crypto/rand"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/xrcrun/xrc/bootstrap"
)

// Server starts a rendezvous server for a job of n ranks, with a fresh
// key, on a free loopback port. It stops when the test ends.
func Server(t testing.TB, n int) (addr string, key []byte) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	key = make([]byte, 32)
	rand.Read(key)
	srv, err := bootstrap.Listen(ctx, "127.0.0.1:0", bootstrap.ServerConfig{Size: n, Key: key})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	go srv.Serve(ctx)
	t.Cleanup(func() {
		srv.Close()
		cancel()
	})
	return srv.Addr(), key
}

// Clients joins one client per rank to a server of their own: rank r on
// node nodes[r], its local rank its place among its node's ranks. The
// clients close when the test ends, after what the test registered for
// cleanup later (transports using them).
func Clients(t testing.TB, nodes []int) []*bootstrap.Client {
	t.Helper()
	n := len(nodes)
	addr, key := Server(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs := make([]*bootstrap.Client, n)
	errs := make([]error, n)
	local := map[int]int{}
	var wg sync.WaitGroup
	for r := range n {
		m := bootstrap.Member{Rank: r, Node: nodes[r], LocalRank: local[nodes[r]]}
		local[nodes[r]]++
		wg.Go(func() {
			cs[r], errs[r] = bootstrap.Join(ctx, addr, key, m, n, bootstrap.ClientConfig{})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		t.Cleanup(func() { c.Close() })
	}
	return cs
}
