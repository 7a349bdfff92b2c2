package xrc

import (
	"testing"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/transport/internal/transporttest"
)

// TestUnequalNodes: rank 0, alone on node 0, streams to rank 1 of node 1
// (of two ranks). Its credits were its own share by its count of remote
// ranks, 253, fewer than the 254 frames after which rank 1 returns
// credits: the stream stopped for good. They are rank 1's share now (rc's
// TestUnequalNodes checks the shares).
func TestUnequalNodes(t *testing.T) {
	transporttest.OneWay(t, job(t, []int{0, 1, 1}, false, softhca.Faults{}, nil).ends, 0, 1, 1000)
}
