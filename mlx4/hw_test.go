package mlx4_test

import (
	"context"
	"testing"

	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// TestConformanceHardware runs the verbs suite on a real ConnectX-3 HCA,
// both sides on its first port, when the machine has one.
func TestConformanceHardware(t *testing.T) {
	devs, err := verbs.Devices(context.Background())
	if err != nil {
		t.Logf("listing devices: %v", err)
	}
	name := ""
	for _, d := range devs {
		if d.Driver == "mlx4" {
			name = d.Name
			break
		}
	}
	if name == "" {
		t.Skip("no mlx4 device on this machine (/sys/class/infiniband lists none): the hardware conformance run needs one")
	}
	verbstest.Run(t, verbstest.Env{Name: name, Open: func(t testing.TB) (a, b *verbs.Context) {
		open := func() *verbs.Context {
			c, err := verbs.Open(context.Background(), name, verbs.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		return open(), open()
	}})
}
