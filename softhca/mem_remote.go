//go:build linux

package softhca

import (
	"errors"
	"fmt"
	"slices"

	"github.com/xrcrun/xrc/internal/unix"
)

// remoteMemory is the memory of a client in another process.
//
// Queue memory is memfd shared memory that the client maps and passes to
// the device, which maps it too (the queueTable holds the device's
// mappings, by the client's addresses). Memory regions stay in the client's
// address space: registration checks them against /proc/<pid>/maps. The
// device reaches a region with plain copies when the client shared the
// memfd memory it lies in (addRegion: verbs.Alloc's memory), and with
// process_vm_readv/writev otherwise; both fail cleanly if the memory or the
// process went away.
type remoteMemory struct {
	processMemory
	queueTable
	maps *mapBudget // counts the device's mappings, unmapped through it

	// Guarded by queueTable.mu.
	shared  []*sharedRegion // sorted by addr, not overlapping
	retired [][]byte        // mappings replaced while regions used them, unmapped on close
}

// sharedRegion is memfd memory of the client that the device maps too.
type sharedRegion struct {
	addr uint64 // in the client
	b    []byte // the device's mapping
	file fileID // the memfd, which tells a new allocation at addr from the old
	refs int    // memory regions using it
}

func (m *remoteMemory) mapping(addr, n uint64, write bool) (fileMapping, error) {
	return checkMapped(m.pid, addr, n, write)
}

// region returns the device's view of [addr, addr+n) of the client if the
// client shared the memfd memory it lies in, or nil (reach it with
// process_vm_readv/writev). fm is what mapping found there. A view is the
// client's memory only while the client maps that memfd there: one it
// freed, and mapped something else at the same address since without
// sharing it, is not (a region on the old view would move data to and
// from memory the client no longer sees). So the view is returned only if
// fm is the very memfd, at the very offset, of the shared region, checked
// here under m.mu against the region as it is now: the client may have
// changed its mappings, and shared other memory, since fm was read. The
// device's mapping keeps the memfd's inode alive, so a match cannot be
// another file that reused the number; a remap after the read is then as
// one after the registration. An unused view found stale is unmapped.
func (m *remoteMemory) region(addr, n uint64, fm fileMapping) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sharedAt(addr, n)
	switch {
	case s == nil:
		return nil, nil
	case fm.file != s.file || fm.off != addr-s.addr: // the client maps the memfd from offset 0
		if s.refs == 0 {
			m.maps.unmap(s.b)
			m.shared = slices.DeleteFunc(m.shared, func(x *sharedRegion) bool { return x == s })
		}
		return nil, nil
	}
	off := addr - s.addr
	return s.b[off : off+n : off+n], nil
}

// sharedAt finds the shared region that holds [addr, addr+n). Caller holds
// m.mu.
func (m *remoteMemory) sharedAt(addr, n uint64) *sharedRegion {
	for _, s := range m.shared {
		if within(s.addr, uint64(len(s.b)), addr, n) {
			return s
		}
	}
	return nil
}

// holder finds the shared region a view returned by region lies in.
// Caller holds m.mu.
func (m *remoteMemory) holder(view []byte) *sharedRegion {
	a := unix.AddrOf(view)
	for _, s := range m.shared {
		if a >= unix.AddrOf(s.b) && a < unix.AddrOf(s.b)+uintptr(len(s.b)) {
			return s
		}
	}
	return nil
}

func (m *remoteMemory) hold(view []byte) {
	if view == nil {
		return
	}
	m.mu.Lock()
	if s := m.holder(view); s != nil {
		s.refs++
	}
	m.mu.Unlock()
}

func (m *remoteMemory) release(view []byte) {
	if view == nil {
		return
	}
	m.mu.Lock()
	if s := m.holder(view); s != nil {
		s.refs--
	}
	m.mu.Unlock()
}

// addShared maps memory the client shares at addr. Shared memory no region
// uses any more, and memory the new one replaces (the client freed it and
// allocated again at the same address), is unmapped; mappings still in use
// stay mapped, unreachable for new regions, until the client disconnects.
// It takes b.
func (m *remoteMemory) addShared(addr uint64, b []byte, file fileID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	end := addr + uint64(len(b))
	if s := m.sharedAt(addr, uint64(len(b))); s != nil && s.addr == addr && len(s.b) == len(b) && s.file == file {
		m.maps.unmap(b) // the same memory again
		return
	}
	m.shared = slices.DeleteFunc(m.shared, func(s *sharedRegion) bool {
		overlaps := s.addr < end && addr < s.addr+uint64(len(s.b))
		switch {
		case s.refs == 0:
			m.maps.unmap(s.b)
			return true
		case overlaps:
			m.retired = append(m.retired, s.b)
			return true
		}
		return false
	})
	i, _ := slices.BinarySearchFunc(m.shared, addr, func(s *sharedRegion, a uint64) int {
		switch {
		case s.addr < a:
			return -1
		case s.addr > a:
			return 1
		}
		return 0
	})
	m.shared = slices.Insert(m.shared, i, &sharedRegion{addr: addr, b: b, file: file})
}

// close unmaps every mapping. The client's objects are destroyed by then.
func (m *remoteMemory) close() {
	for _, s := range m.takeAll() {
		m.maps.unmap(s.b)
	}
	m.mu.Lock()
	for _, s := range m.shared {
		m.maps.unmap(s.b)
	}
	for _, b := range m.retired {
		m.maps.unmap(b)
	}
	m.shared, m.retired = nil, nil
	m.mu.Unlock()
}

// errNoPtrace explains a process_vm_readv refused by the kernel.
var errNoPtrace = errors.New("the device cannot reach the client's memory: " +
	"process_vm_readv/writev need the device to run as the same user as its clients (or as root), " +
	"and, where the Yama LSM is on, kernel.yama.ptrace_scope=0 (sysctl -w kernel.yama.ptrace_scope=0) " +
	"or the device to hold CAP_SYS_PTRACE")

// probe checks that the device can read the client's memory: nonce must be
// at addr.
func (m *remoteMemory) probe(addr uint64, nonce []byte) error {
	got := make([]byte, len(nonce))
	if err := m.read(addr, got); err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			return unix.Errorf(unix.EPERM, "%v (%v)", errNoPtrace, err)
		}
		return err
	}
	if string(got) != string(nonce) {
		return unix.Error(unix.EFAULT, fmt.Sprintf("the probe at %#x of pid %d does not hold the nonce: is the client in another PID namespace?", addr, m.pid))
	}
	return nil
}
