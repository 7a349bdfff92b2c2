//go:build linux

package softhca

import (
	"errors"
	"fmt"

	"github.com/xrcrun/xrc/internal/unix"
)

// remoteMemory is the memory of a client in another process.
//
// Queue memory is memfd shared memory that the client maps and passes to
// the device, which maps it too (the queueTable holds the device's
// mappings, by the client's addresses). Memory regions stay in the client's
// address space: registration checks them against /proc/<pid>/maps, and DMA
// copies with process_vm_readv/writev, which fail cleanly if the memory or
// the process went away.
type remoteMemory struct {
	pid int
	queueTable
	retired [][]byte // mappings removed while still in use, unmapped on close
}

func (m *remoteMemory) region(addr, n uint64, write bool) ([]byte, error) {
	return nil, checkMapped(m.pid, addr, n, write)
}

func (m *remoteMemory) read(addr uint64, b []byte) error  { return unix.ProcessVMRead(m.pid, b, addr) }
func (m *remoteMemory) write(addr uint64, b []byte) error { return unix.ProcessVMWrite(m.pid, b, addr) }

// close unmaps every queue mapping. The client's objects are destroyed by
// then.
func (m *remoteMemory) close() {
	for _, s := range m.takeAll() {
		unix.Munmap(s.b)
	}
	m.mu.Lock()
	for _, b := range m.retired {
		unix.Munmap(b)
	}
	m.retired = nil
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
