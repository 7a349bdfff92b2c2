//go:build linux

package unix

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations (linux/futex.h), shared between processes: not the
// private variants.
const (
	futexWait = 0
	futexWake = 1
)

// FutexWait sleeps while *addr holds val, until FutexWake on the same word
// (from any process that maps it shared), a signal, or the timeout (none if
// d <= 0). The word may live in memory shared between processes: the
// futex is not private. It returns nil when woken or when *addr no longer
// held val; a timeout is not an error either: callers check their
// condition again.
func FutexWait(addr *atomic.Uint32, val uint32, d time.Duration) error {
	var ts *unix.Timespec
	if d > 0 {
		t := unix.NsecToTimespec(d.Nanoseconds())
		ts = &t
	}
	_, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val),
		uintptr(unsafe.Pointer(ts)), 0, 0)
	switch e {
	case 0, unix.EAGAIN, unix.EINTR, unix.ETIMEDOUT:
		return nil
	}
	return Error(e, "futex wait")
}

// FutexWake wakes up to n waiters sleeping on addr in any process.
func FutexWake(addr *atomic.Uint32, n int) error {
	_, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, uintptr(n), 0, 0, 0)
	if e != 0 {
		return Error(e, "futex wake")
	}
	return nil
}
