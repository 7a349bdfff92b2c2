package comm

import (
	"context"
	"encoding/hex"
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/bootstrap/boottest"
)

// TestInitFailureLeavesJob: an Init that joined the job from the
// environment (Config.Bootstrap nil) and then fails closes the client it
// made, which nobody else can: the job learns at once that the rank is
// gone. The client stayed joined, its connection and goroutines leaked,
// and the other ranks waited for the rank until their contexts ended.
func TestInitFailureLeavesJob(t *testing.T) {
	addr, key := boottest.Server(t, 2)
	for name, v := range map[string]string{
		bootstrap.EnvAddr: addr, bootstrap.EnvKey: hex.EncodeToString(key),
		bootstrap.EnvRank: "0", bootstrap.EnvSize: "2", bootstrap.EnvLocalRank: "0", bootstrap.EnvLocalSize: "1",
		bootstrap.EnvNode: "0", bootstrap.EnvNodes: "2",
	} {
		t.Setenv(name, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other := make(chan error, 1)
	go func() {
		c, err := bootstrap.Join(ctx, addr, key, bootstrap.Member{Rank: 1, Node: 1}, 2, bootstrap.ClientConfig{})
		if err != nil {
			other <- err
			return
		}
		defer c.Close()
		actx, acancel := context.WithTimeout(ctx, 10*time.Second)
		defer acancel()
		_, err = c.AllGather(actx, []byte(strconv.Itoa(1)))
		other <- err
	}()
	// No such directory: the shared-memory transport fails, after the join.
	_, err := Init(ctx, Config{Dir: filepath.Join(t.TempDir(), "missing")})
	if err == nil {
		t.Fatal("Init with a missing directory: no error")
	}
	var ae *bootstrap.AbortError
	if err := <-other; !errors.As(err, &ae) || ae.Rank != 0 {
		t.Errorf("the other rank's all-gather after rank 0's Init failed: %v, want a *bootstrap.AbortError of rank 0", err)
	}
}
