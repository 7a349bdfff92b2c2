package bootstrap

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// TestCloseConcurrentWithCalls: Close while other goroutines call Put
// (and Close) sends nothing after the leave. Before, a call could take
// the write lock between Close's leave and the client's end, and send a
// frame after the leave, which the server counted (and logged as an
// error) as a bad message from a correct program. The race is narrow, so
// the test tries it many times; it cannot fail on correct code.
func TestCloseConcurrentWithCalls(t *testing.T) {
	ctx := testCtx(t)
	for round := range 200 {
		ts := startServer(t, ServerConfig{Size: 1})
		cs := joinAll(t, ts.Addr(), 1)
		var wg sync.WaitGroup
		var puts atomic.Int64
		for g := range 8 {
			wg.Go(func() {
				for j := 0; ; j++ {
					if err := cs[0].Put(ctx, fmt.Sprintf("k%d-%d", g, j), nil); err != nil {
						if !errors.Is(err, ErrClosed) {
							t.Errorf("round %d: Put while closing: %v", round, err)
						}
						return
					}
					puts.Add(1)
				}
			})
		}
		for range 2 {
			wg.Go(func() {
				for puts.Load() < 64 { // the putters are under way
					runtime.Gosched()
				}
				cs[0].Close()
			})
		}
		wg.Wait()
		if err := ts.result(t); err != nil {
			t.Fatalf("round %d: Serve: %v", round, err)
		}
		if v := metric(t, ts.reg, "xrc_bootstrap_server_bad_messages_total"); v != 0 {
			t.Fatalf("round %d: a client closing while it put: the server counted %v bad messages", round, v)
		}
	}
}
