package softhca_test

import (
	"strings"
	"testing"
)

// TestLosslessExcuseDeviceGone: a device that had late rounds when the
// watch began and is gone (or restarted, its counters from zero) when
// the excuse is asked for is no evidence of a late round meanwhile. The
// sum of the late rounds went down, and its difference wrapped around to
// some 18 quintillion late rounds, which excused any transport timeout.
func TestLosslessExcuseDeviceGone(t *testing.T) {
	devices := map[string]uint64{"a": 3, "b": 0}
	w := watchLossless(t, func() map[string]uint64 { return devices })
	devices = map[string]uint64{"b": 0} // a exited
	if why := w.excuse(t); strings.Contains(why, "late") {
		t.Fatalf("no device answered late, yet the excuse is %q", why)
	}
	devices = map[string]uint64{"a2": 0, "b": 0} // a restarted
	if why := w.excuse(t); strings.Contains(why, "late") {
		t.Fatalf("no device answered late, yet the excuse is %q", why)
	}
	devices = map[string]uint64{"a2": 1, "b": 1}
	if why := w.excuse(t); !strings.Contains(why, "devices answered 2 times") {
		t.Fatalf("two late rounds since the watch began; the excuse is %q", why)
	}
}
