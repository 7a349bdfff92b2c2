package verbsx

import (
	"testing"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/transport/internal/transporttest"
	"github.com/xrcrun/xrc/verbs"
)

// newDevice starts an in-process soft HCA on a fabric of its own and
// opens it.
func newDevice(t testing.TB, faults softhca.Faults) (*softhca.Device, *verbs.Context) {
	t.Helper()
	return transporttest.OpenDevice(t, "vx", softhca.Config{Fabric: softhca.NewFabric(), Faults: faults})
}
