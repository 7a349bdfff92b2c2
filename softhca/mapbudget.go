//go:build linux

package softhca

import (
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/xrcrun/xrc/internal/unix"
)

// mapBudget counts the device's mappings of its clients' memory (queue
// and region memfds, bell rings). Each is one of the process's
// vm.max_map_count; past it the Go runtime cannot map its own heap and
// the device dies, so clients, which may add memory without end, get
// ENOMEM once the budget is spent, well before that.
type mapBudget struct {
	n   atomic.Int64
	max int64
}

// newMapBudget leaves room for the runtime's own mappings below the
// system's limit.
func newMapBudget() *mapBudget {
	limit := int64(65530) // the kernel's default
	if b, err := os.ReadFile("/proc/sys/vm/max_map_count"); err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			limit = v
		}
	}
	return &mapBudget{max: max(limit-16384, limit/2)}
}

// take counts a mapping about to be made, or refuses it.
func (m *mapBudget) take() error {
	if m.n.Add(1) > m.max {
		m.n.Add(-1)
		return unix.Errorf(unix.ENOMEM, "the device maps %d pieces of its clients' memory already; free some", m.max)
	}
	return nil
}

// give uncounts a mapping that was not made.
func (m *mapBudget) give() { m.n.Add(-1) }

// unmap unmaps a counted mapping.
func (m *mapBudget) unmap(b []byte) {
	unix.Munmap(b)
	m.n.Add(-1)
}
