package comm

import (
	"context"
	"fmt"
	"testing"
)

// TestNilOp: a reduction given a nil Op returns an error on every rank,
// as for the other bad arguments, instead of panicking in the rank's
// goroutine (or a worker's, for the non-blocking forms, which no recover
// of the caller's can catch); the calls after it still pair up.
func TestNilOp(t *testing.T) {
	comms := world(t, 2, nil)
	calls := map[string]func(ctx context.Context, c *Comm) error{
		"Reduce":    func(ctx context.Context, c *Comm) error { return Reduce(ctx, c, []int{1}, []int{0}, nil, 0) },
		"Allreduce": func(ctx context.Context, c *Comm) error { return Allreduce(ctx, c, []int{1}, []int{0}, nil) },
		"ReduceScatter": func(ctx context.Context, c *Comm) error {
			return ReduceScatter(ctx, c, []int{1, 2}, []int{0}, []int{1, 1}, nil)
		},
		"Scan":   func(ctx context.Context, c *Comm) error { return Scan(ctx, c, []int{1}, []int{0}, nil) },
		"Exscan": func(ctx context.Context, c *Comm) error { return Exscan(ctx, c, []int{1}, []int{0}, nil) },
		"Iallreduce": func(ctx context.Context, c *Comm) error {
			_, err := Iallreduce(ctx, c, []int{1}, []int{0}, nil).Wait(ctx)
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			each(t, comms, func(ctx context.Context, c *Comm) (err error) {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				if err := call(ctx, c); err == nil {
					return fmt.Errorf("%s with a nil op: no error", name)
				}
				return c.Barrier(ctx)
			})
		})
	}
}
