//go:build linux

package uverbs

import (
	"testing"

	"github.com/xrcrun/xrc/internal/abitest"
)

// TestLayout compares every generated struct with gcc's layout of the
// kernel header it came from.
func TestLayout(t *testing.T) {
	abitest.Check(t, layoutIncludes, generatedLayouts)
}
