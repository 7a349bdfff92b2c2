//go:build linux

package softhca

import (
	"unsafe"

	"github.com/xrcrun/xrc/internal/mlx4hw"
)

func unsafeSize[T any](v T) uintptr { return unsafe.Sizeof(v) }

// nativeBE64 returns the native integer whose memory is v big-endian, for
// __be64 fields of ABI structs.
func nativeBE64(v uint64) uint64 { return mlx4hw.NativeBE64(v) }

// roundPow2 rounds n up to a power of two (1 for 0).
func roundPow2(n uint32) uint32 {
	p := uint32(1)
	for p < n {
		p <<= 1
	}
	return p
}

// log2 returns the base-2 logarithm of a power of two.
func log2(n uint32) uint {
	s := uint(0)
	for 1<<s < n {
		s++
	}
	return s
}

// within reports whether [addr, addr+n) lies in [base, base+size), in
// steps that cannot wrap around 2^64 as addr-base+n could.
func within(base, size, addr, n uint64) bool {
	return addr >= base && addr-base <= size && n <= size-(addr-base)
}

// fileID identifies a file however it was opened: its device's major and
// minor numbers and its inode (the shared memory a client maps, the file
// of an XRC domain).
type fileID struct {
	major, minor uint32
	ino          uint64
}
