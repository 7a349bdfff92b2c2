package prefetch

import (
	"testing"
	"unsafe"
)

// A prefetch changes nothing a program can see, and takes any address:
// one in a live object, one past it, and nil.
func TestAddrs(t *testing.T) {
	buf := make([]byte, 4*Line)
	for i := range buf {
		buf[i] = byte(i)
	}
	base := uintptr(unsafe.Pointer(&buf[0]))
	Addrs([]uintptr{base, base + Line, base + 1<<40, 0})
	Addrs(nil)
	for i := range buf {
		if buf[i] != byte(i) {
			t.Fatalf("byte %d is %d after prefetching", i, buf[i])
		}
	}
}
