package bootstrap

import (
	"context"
	"fmt"
)

// FromEnv joins the job that the launcher described in the environment
// (ReadEnv(nil)), registering this rank with no endpoint record (exchange
// records with AllGather). Without EnvAddr it returns a world of one, rank
// 0 of 1, which needs no server: its collectives return at once, and Get
// waits for this rank's own Put.
func FromEnv(ctx context.Context, cfg ClientConfig) (*Client, Env, error) {
	env, err := ReadEnv(nil)
	if err != nil {
		return nil, env, err
	}
	me := Member{Rank: env.Rank, Node: env.Node, LocalRank: env.LocalRank}
	if env.Addr == "" {
		return newLocal(me, cfg), env, nil
	}
	c, err := Join(ctx, env.Addr, env.Key, me, env.Size, cfg)
	if err != nil {
		return nil, env, fmt.Errorf("%w (from %s=%s)", err, EnvAddr, env.Addr)
	}
	return c, env, nil
}
