//go:build linux

package softhca

import (
	"cmp"
	"slices"
	"sync"

	"github.com/xrcrun/xrc/internal/unix"
)

// queueTable is the queue memory a client shares with the device: spans of
// the client's address space, each with the device's view of it. Queue
// addresses in commands must fall in a span, so a command cannot point the
// device at arbitrary memory.
type queueTable struct {
	mu     sync.Mutex
	queues []span // guarded by mu; sorted by addr
}

// span is queue memory at addr in the client, b in the device.
type span struct {
	addr uint64
	b    []byte
}

func (t *queueTable) find(addr uint64) (int, bool) {
	return slices.BinarySearchFunc(t.queues, addr, func(x span, a uint64) int { return cmp.Compare(x.addr, a) })
}

// addQueue shares b, which the client sees at addr. It reports false if
// the span overlaps one shared already.
func (t *queueTable) addQueue(addr uint64, b []byte) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	end := addr + uint64(len(b))
	if end < addr || len(b) == 0 {
		return false
	}
	i, found := t.find(addr)
	if found || i > 0 && t.queues[i-1].addr+uint64(len(t.queues[i-1].b)) > addr ||
		i < len(t.queues) && t.queues[i].addr < end {
		return false
	}
	t.queues = slices.Insert(t.queues, i, span{addr: addr, b: b})
	return true
}

// removeQueue stops sharing the span at addr and returns it.
func (t *queueTable) removeQueue(addr uint64) (span, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.find(addr)
	if !ok {
		return span{}, false
	}
	s := t.queues[i]
	t.queues = slices.Delete(t.queues, i, i+1)
	return s, true
}

// queue returns the device's view of [addr, addr+n) of queue memory.
func (t *queueTable) queue(addr uint64, n int) ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, found := t.find(addr)
	if !found {
		i--
	}
	if i >= 0 && n >= 0 {
		s := t.queues[i]
		if within(s.addr, uint64(len(s.b)), addr, uint64(n)) {
			off := addr - s.addr
			return s.b[off : off+uint64(n) : off+uint64(n)], nil
		}
	}
	return nil, unix.Errorf(unix.EFAULT, "%d bytes at %#x are not queue memory of the client", n, addr)
}

// takeAll empties the table and returns what it held.
func (t *queueTable) takeAll() []span {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.queues
	t.queues = nil
	return q
}
