package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/xrcrun/xrc/bootstrap"
)

// listenRendezvous starts the job's bootstrap server on addr (host:port)
// for size ranks holding key.
func listenRendezvous(ctx context.Context, addr string, size int, key []byte, log *slog.Logger) (*bootstrap.Server, error) {
	return bootstrap.Listen(ctx, addr, bootstrap.ServerConfig{Size: size, Key: key, Logger: log})
}

// culprit returns what the bootstrap server's Serve returned about the
// rank that aborted the job or was lost first, or nil.
func culprit(served error) *bootstrap.AbortError {
	var ae *bootstrap.AbortError
	if errors.As(served, &ae) && ae.Rank >= 0 {
		return ae
	}
	return nil
}
