package bootstrap_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log"

	"github.com/xrcrun/xrc/bootstrap"
)

// Rank 0 runs the server itself when ranks are started by something else
// (srun, say): it listens, publishes the address out of band and joins
// like every rank. Here the job has one rank.
func Example_rank0Server() {
	ctx := context.Background()
	key := make([]byte, 32)
	rand.Read(key) // shared with the other ranks out of band, as the address is
	const size = 1

	srv, err := bootstrap.Listen(ctx, "127.0.0.1:0", bootstrap.ServerConfig{Size: size, Key: key})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	go srv.Serve(ctx)
	// Publish srv.Addr() for the other ranks here.

	me := bootstrap.Member{Rank: 0, Endpoint: []byte("rank 0's QPN and GID")}
	c, err := bootstrap.Join(ctx, srv.Addr(), key, me, size, bootstrap.ClientConfig{})
	if err != nil {
		log.Fatal(err)
	}
	recs, err := c.AllGather(ctx, []byte("hello"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d ranks, rank 0 sent %q, its endpoint is %q\n", c.Size(), recs[0], c.Members()[0].Endpoint)
	if err := c.Barrier(ctx); err != nil { // every rank is done
		log.Fatal(err)
	}
	if err := c.Close(); err != nil {
		log.Fatal(err)
	}
	// Output: 1 ranks, rank 0 sent "hello", its endpoint is "rank 0's QPN and GID"
}
