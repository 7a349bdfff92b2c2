package softhca

import (
	"github.com/xrcrun/xrc/internal/unix"
)

// fakeMemory is a client address space for tests: size bytes that the
// client sees at base. Everything outside is unmapped (EFAULT), so arbitrary
// commands cannot make the device touch the test's own memory.
type fakeMemory struct {
	base uint64
	mem  []byte
}

func newFakeMemory(base uint64, size int) *fakeMemory {
	return &fakeMemory{base: base, mem: make([]byte, size)}
}

func (m *fakeMemory) span(addr uint64, n uint64) ([]byte, error) {
	if addr < m.base || addr-m.base > uint64(len(m.mem)) || n > uint64(len(m.mem))-(addr-m.base) {
		return nil, unix.Errorf(unix.EFAULT, "%d bytes at %#x outside the fake address space", n, addr)
	}
	off := addr - m.base
	return m.mem[off : off+n : off+n], nil
}

func (m *fakeMemory) queue(addr uint64, n int) ([]byte, error) {
	if n < 0 {
		return nil, unix.Error(unix.EFAULT, "negative length")
	}
	return m.span(addr, uint64(n))
}

func (m *fakeMemory) mapping(addr, n uint64, write bool) (fileMapping, error) {
	_, err := m.span(addr, n)
	return fileMapping{}, err
}
func (m *fakeMemory) region(addr, n uint64, _ fileMapping) ([]byte, error) { return m.span(addr, n) }

func (m *fakeMemory) read(addr uint64, b []byte) error {
	s, err := m.span(addr, uint64(len(b)))
	if err != nil {
		return err
	}
	copy(b, s)
	return nil
}

func (m *fakeMemory) readv(addr uint64, bs [][]byte) error  { return eachBuffer(addr, bs, m.read) }
func (m *fakeMemory) writev(addr uint64, bs [][]byte) error { return eachBuffer(addr, bs, m.write) }

// eachBuffer calls f for each buffer of bs and the address it goes at, from
// addr on.
func eachBuffer(addr uint64, bs [][]byte, f func(uint64, []byte) error) error {
	for _, b := range bs {
		if err := f(addr, b); err != nil {
			return err
		}
		addr += uint64(len(b))
	}
	return nil
}

func (m *fakeMemory) write(addr uint64, b []byte) error {
	s, err := m.span(addr, uint64(len(b)))
	if err != nil {
		return err
	}
	copy(s, b)
	return nil
}

func (m *fakeMemory) close()         {}
func (m *fakeMemory) hold([]byte)    {}
func (m *fakeMemory) release([]byte) {}
