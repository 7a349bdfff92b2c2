package main

import (
	"context"
	"testing"

	"github.com/xrcrun/xrc/bootstrap"
)

// TestWorldOfOne: without a launcher, hello is rank 0 of 1 and its barrier
// returns at once. cmd/xrcrun's tests run it as a job.
func TestWorldOfOne(t *testing.T) {
	t.Setenv(bootstrap.EnvAddr, "")
	if err := run(context.Background()); err != nil {
		t.Fatal(err)
	}
}
