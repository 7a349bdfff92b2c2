//go:build linux

package softhca

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"

	"github.com/xrcrun/xrc/internal/racedma"
	"github.com/xrcrun/xrc/softhca/roce"
)

// DMA: the device moves data between the wire and memory regions. Callers
// have checked keys, access and bounds; an access to a region deregistered
// since, or to a client whose memory went away, fails.

// read copies len(dst) bytes at va of the region.
func (m *mr) read(va uint64, dst []byte) bool {
	if m.dead {
		return false
	}
	off := va - m.iova
	if m.view != nil {
		copy(dst, m.view[off:])
		racedma.Release()
		return true
	}
	return m.client.mem.read(m.addr+off, dst) == nil
}

// readv copies the bytes at va of the region into the buffers of dsts in
// turn, as read would into their concatenation: for memory the device
// reaches through another process, with one system call for a run of
// packets instead of one each.
func (m *mr) readv(va uint64, dsts [][]byte) bool {
	if m.dead {
		return false
	}
	off := va - m.iova
	if m.view != nil {
		for _, b := range dsts {
			off += uint64(copy(b, m.view[off:]))
		}
		racedma.Release()
		return true
	}
	return m.client.mem.readv(m.addr+off, dsts) == nil
}

// lend points the payloads of ps, in turn, at the region's bytes from va
// instead of copying the bytes into them, when the device maps the region
// (its view): the link then sends the data from there, and the only copy is
// the kernel's into the socket buffer. A borrowed payload stays valid
// while the device mutex is held, which it is until the round's packets
// are sent; a packet kept longer gets its own copy (own). lend reports
// false, and changes nothing, for a region it cannot lend from.
//
// Only memory the program may not change until the device is done with it
// is lent: the data of its own SENDs and WRITEs. The link computes the
// ICRC over the memory and the kernel copies it a moment later, so a
// program that writes to a buffer it is sending anyway gets, instead of
// torn data, packets the receiver drops: the request is retried and fails
// (RETRY_EXC_ERR) if the writes go on. READ responses are copied, as the
// memory being read may change at any time.
func (m *mr) lend(va uint64, ps []*roce.Packet) bool {
	if m.dead || m.view == nil {
		return false
	}
	at := va - m.iova
	for _, p := range ps {
		end := at + uint64(len(p.Payload))
		p.Payload = m.view[at:end:end]
		at = end
	}
	return true
}

// write copies src to va of the region.
func (m *mr) write(va uint64, src []byte) bool {
	if m.dead {
		return false
	}
	off := va - m.iova
	if m.view != nil {
		copy(m.view[off:], src)
		racedma.Release()
		return true
	}
	return m.client.mem.write(m.addr+off, src) == nil
}

// atomic performs a compare-and-swap or fetch-and-add on the 8 bytes at va
// (host byte order) and returns the value before. In the device's process
// it is atomic for the CPU too; through another process's memory it is
// atomic with respect to this device's other atomics (IBV_ATOMIC_HCA), as
// they all run under the device mutex. It reports false if va is not 8-byte
// aligned in memory or the memory could not be reached.
func (m *mr) atomic(va uint64, op roce.Opcode, swapAdd, compare uint64) (uint64, bool) {
	if m.dead {
		return 0, false
	}
	off := va - m.iova
	if m.view != nil {
		b := m.view[off : off+8]
		p := (*uint64)(unsafe.Pointer(unsafe.SliceData(b)))
		if uintptr(unsafe.Pointer(p))%8 != 0 {
			return 0, false
		}
		if op == roce.FetchAdd {
			return atomic.AddUint64(p, swapAdd) - swapAdd, true
		}
		for {
			old := atomic.LoadUint64(p)
			if old != compare {
				return old, true
			}
			if atomic.CompareAndSwapUint64(p, old, swapAdd) {
				return old, true
			}
		}
	}
	if (m.addr+off)%8 != 0 {
		return 0, false
	}
	var b [8]byte
	if m.client.mem.read(m.addr+off, b[:]) != nil {
		return 0, false
	}
	old := binary.NativeEndian.Uint64(b[:])
	nv := old + swapAdd
	if op == roce.CompareSwap {
		if old != compare {
			return old, true
		}
		nv = swapAdd
	}
	binary.NativeEndian.PutUint64(b[:], nv)
	return old, m.client.mem.write(m.addr+off, b[:]) == nil
}
