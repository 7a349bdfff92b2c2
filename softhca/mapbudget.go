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
// and region memfds, bell rings), in number and in bytes. Each mapping is
// one of the process's vm.max_map_count, and all take its address space
// (128 TiB on amd64; a region's mapping may be up to maxMRSize): past
// either the Go runtime cannot map its own heap and the device dies, so
// clients, which may add memory without end, get ENOMEM once the budget
// is spent, well before that.
type mapBudget struct {
	n, bytes      atomic.Int64
	max, maxBytes int64
}

// maxMappedBytes is the address space the device lets its clients'
// memory take: half of what a 47-bit user address space holds, leaving
// the runtime the rest.
const maxMappedBytes = 1 << 46

// newMapBudget leaves room for the runtime's own mappings below the
// system's limit.
func newMapBudget() *mapBudget {
	limit := int64(65530) // the kernel's default
	if b, err := os.ReadFile("/proc/sys/vm/max_map_count"); err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			limit = v
		}
	}
	return &mapBudget{max: max(limit-16384, limit/2), maxBytes: maxMappedBytes}
}

// take counts a mapping of size bytes about to be made, or refuses it.
func (m *mapBudget) take(size int) error {
	if m.n.Add(1) > m.max {
		m.n.Add(-1)
		return unix.Errorf(unix.ENOMEM, "the device maps %d pieces of its clients' memory already; free some", m.max)
	}
	if m.bytes.Add(int64(size)) > m.maxBytes {
		m.give(size)
		return unix.Errorf(unix.ENOMEM, "the device maps %d bytes of its clients' memory at most, and %d more would pass that; free some",
			m.maxBytes, size)
	}
	return nil
}

// give uncounts a mapping of size bytes that was not made.
func (m *mapBudget) give(size int) {
	m.n.Add(-1)
	m.bytes.Add(-int64(size))
}

// unmap unmaps a counted mapping.
func (m *mapBudget) unmap(b []byte) {
	unix.Munmap(b)
	m.give(len(b))
}
