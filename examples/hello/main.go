// Command hello is the smallest xrc job: each rank joins the job's
// rendezvous, says where it runs, and waits for the others in a barrier.
//
//	xrcrun -n 8 --nodes 2 ./examples/hello
//
// Run without a launcher, it is a world of one.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/xrcrun/xrc/bootstrap"
)

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "hello:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	c, env, err := bootstrap.FromEnv(ctx, bootstrap.ClientConfig{})
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("rank %d of %d on node %d (local rank %d)\n", env.Rank, env.Size, env.Node, env.LocalRank)
	if err := c.Barrier(ctx); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	return c.Close()
}
