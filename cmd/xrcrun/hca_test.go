package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestHCAFaultsChecked: xrcrun hca refuses a fault probability outside 0
// to 1 and a negative --delay-by before it brings up a device.
func TestHCAFaultsChecked(t *testing.T) {
	for _, args := range [][]string{{"--loss", "1.5"}, {"--dup", "-1"}, {"--reorder", "NaN"}, {"--delay", "2"}, {"--delay-by", "-1ms"}} {
		var stderr bytes.Buffer
		all := append([]string{"--name", "faults-checked", "--addr", "127.0.0.1", "--dir", t.TempDir()}, args...)
		err := runHCA(context.Background(), all, &stderr, &stderr)
		if err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%q: %v; want an error naming %s", args, err, args[0])
		}
		if strings.Contains(stderr.String(), "device up") {
			t.Errorf("%q: the device came up: %s", args, stderr.String())
		}
	}
}
