//go:build linux

// Package unix is the only importer of golang.org/x/sys/unix (tests
// aside): the thin syscall layer under the verbs providers, the software
// HCA and the launcher. It wraps errnos so that callers match them with
// errors.Is, and it owns the few places where raw addresses become Go
// memory.
package unix

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Errno values used across the project. They are syscall.Errno, so
// errors.Is(err, syscall.EBUSY) and errors.Is(err, unix.EBUSY) agree.
const (
	E2BIG        = unix.E2BIG
	EACCES       = unix.EACCES
	EAGAIN       = unix.EAGAIN
	EBADF        = unix.EBADF
	EBUSY        = unix.EBUSY
	ECONNREFUSED = unix.ECONNREFUSED
	EEXIST       = unix.EEXIST
	EFAULT       = unix.EFAULT
	EINVAL       = unix.EINVAL
	EIO          = unix.EIO
	EMFILE       = unix.EMFILE
	EMSGSIZE     = unix.EMSGSIZE
	ENODEV       = unix.ENODEV
	ENOENT       = unix.ENOENT
	ENOMEM       = unix.ENOMEM
	ENOSPC       = unix.ENOSPC
	ENOSYS       = unix.ENOSYS
	EOPNOTSUPP   = unix.EOPNOTSUPP
	EPERM        = unix.EPERM
	EPROTO       = unix.EPROTO
	ESRCH        = unix.ESRCH
)

// Errno is a system error number.
type Errno = syscall.Errno

// wrappedErrno hides an Errno behind a type of its own, so that code has to
// use errors.Is rather than ==, and a message can say what failed.
type wrappedErrno struct {
	errno Errno
	msg   string
}

func (e *wrappedErrno) Error() string {
	if e.msg == "" {
		return e.errno.Error()
	}
	return e.msg + ": " + e.errno.Error()
}

func (e *wrappedErrno) Unwrap() error { return e.errno }

// WrapErrno wraps err when it is a bare Errno and returns other errors as
// they are.
func WrapErrno(err error) error {
	var e Errno
	if errors.As(err, &e) && err == error(e) {
		return &wrappedErrno{errno: e}
	}
	return err
}

// Error returns an error that says msg and matches errno with errors.Is.
func Error(errno Errno, msg string) error {
	return &wrappedErrno{errno: errno, msg: msg}
}

// Errorf is Error with formatting.
func Errorf(errno Errno, format string, args ...any) error {
	return &wrappedErrno{errno: errno, msg: fmt.Sprintf(format, args...)}
}

// PageSize is the system page size.
var PageSize = os.Getpagesize()

// MmapAnon maps n bytes (rounded up to pages) of private anonymous memory,
// readable and writable, page aligned and zeroed.
func MmapAnon(n int) ([]byte, error) {
	if n <= 0 {
		return nil, Error(EINVAL, "mmap: empty length")
	}
	b, err := unix.Mmap(-1, 0, roundPage(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, Error(asErrno(err), "mmap")
	}
	return b[:n], nil
}

// MmapShared maps n bytes of fd at offset off, shared and read-write.
func MmapShared(fd int, off int64, n int) ([]byte, error) {
	b, err := unix.Mmap(fd, off, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, Error(asErrno(err), "mmap shared")
	}
	return b, nil
}

// Munmap unmaps memory returned by MmapAnon or MmapShared.
func Munmap(b []byte) error {
	if cap(b) == 0 {
		return nil
	}
	if err := unix.Munmap(b[:cap(b)]); err != nil {
		return Error(asErrno(err), "munmap")
	}
	return nil
}

func roundPage(n int) int { return (n + PageSize - 1) &^ (PageSize - 1) }

// AddrOf returns the address of the first byte of b (0 for an empty slice).
func AddrOf(b []byte) uintptr {
	if cap(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}

// Bytes returns the n bytes of this process's memory at addr as a slice.
// The caller guarantees that the memory is mapped, stays mapped while the
// slice is used, and is not Go heap memory that could be freed. It is how the
// in-process software HCA reaches memory that was registered with it.
func Bytes(addr uintptr, n int) []byte {
	if n == 0 {
		return nil
	}
	// Load the address as a pointer instead of converting the integer, which
	// is the documented way to refer to memory the Go runtime did not
	// allocate without tripping the unsafe-pointer checks.
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

// ProcessVMRead copies len(local) bytes from remote address addr of process
// pid into local.
func ProcessVMRead(pid int, local []byte, addr uint64) error {
	return processVMVec(pid, [][]byte{local}, addr, false)
}

// maxVMIovecs bounds the local buffers, empty ones included, that one
// process_vm_readv or process_vm_writev of ProcessVMReadVec and
// ProcessVMWriteVec takes (the kernel's limit is 1024).
const maxVMIovecs = 64

// ProcessVMReadVec copies the bytes at remote address addr of process pid
// into the local buffers in turn, as if they were one: it reads
// [addr, addr+total) where total is the sum of their lengths, with one
// process_vm_readv for up to 64 buffers. The kernel's cost of such a call
// (finding the process, checking access, pinning its pages) is paid per
// call, so a run of packets of one message is read at once.
func ProcessVMReadVec(pid int, local [][]byte, addr uint64) error {
	return processVMVec(pid, local, addr, false)
}

// ProcessVMWriteVec copies the local buffers in turn to remote address
// addr of process pid, as if they were one, with one process_vm_writev for
// up to 64 buffers (see ProcessVMReadVec).
func ProcessVMWriteVec(pid int, local [][]byte, addr uint64) error {
	return processVMVec(pid, local, addr, true)
}

// processVMVec moves the bytes of the local buffers, in turn, from (or, if
// write, to) [addr, addr+total) of process pid, 64 buffers a system call.
// The system calls are named outright, not passed as a function, so that
// the iovecs stay on the stack.
func processVMVec(pid int, local [][]byte, addr uint64, write bool) error {
	name := "process_vm_readv"
	if write {
		name = "process_vm_writev"
	}
	var iov [maxVMIovecs]unix.Iovec
	for len(local) > 0 {
		l, total := vmIovecs(iov[:0], local[:min(len(local), maxVMIovecs)])
		local = local[min(len(local), maxVMIovecs):]
		if total == 0 {
			continue
		}
		r := []unix.RemoteIovec{{Base: uintptr(addr), Len: total}}
		var n int
		var err error
		if write {
			n, err = unix.ProcessVMWritev(pid, l, r, 0)
		} else {
			n, err = unix.ProcessVMReadv(pid, l, r, 0)
		}
		if err != nil {
			return Errorf(asErrno(err), "%s of %d bytes at %#x in pid %d", name, total, addr, pid)
		}
		if n != total {
			return Errorf(EFAULT, "%s: %d of %d bytes at %#x in pid %d", name, n, total, addr, pid)
		}
		addr += uint64(total)
	}
	return nil
}

// vmIovecs appends to l an iovec for each non-empty buffer of bs, and
// returns it with the bytes they hold.
func vmIovecs(l []unix.Iovec, bs [][]byte) ([]unix.Iovec, int) {
	total := 0
	for _, b := range bs {
		if len(b) == 0 {
			continue
		}
		v := unix.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		l = append(l, v)
		total += len(b)
	}
	return l, total
}

// ProcessVMWrite copies local to remote address addr of process pid.
func ProcessVMWrite(pid int, local []byte, addr uint64) error {
	return processVMVec(pid, [][]byte{local}, addr, true)
}

// Socketpair returns a connected pair of close-on-exec unix sockets of the
// given type (unix.SOCK_SEQPACKET, ...).
func Socketpair(typ int) ([2]int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fds, Error(asErrno(err), "socketpair")
	}
	return fds, nil
}

// Socket types for Socketpair.
const (
	SOCK_SEQPACKET = unix.SOCK_SEQPACKET
	SOCK_STREAM    = unix.SOCK_STREAM
	SOCK_DGRAM     = unix.SOCK_DGRAM
)

// SetNonblock puts fd in non-blocking mode.
func SetNonblock(fd int) error {
	if err := unix.SetNonblock(fd, true); err != nil {
		return Error(asErrno(err), "set non-blocking")
	}
	return nil
}

// Close closes fd.
func Close(fd int) error {
	if err := unix.Close(fd); err != nil {
		return Error(asErrno(err), "close")
	}
	return nil
}

// Write writes b to fd without blocking semantics of its own.
func Write(fd int, b []byte) (int, error) {
	n, err := unix.Write(fd, b)
	if err != nil {
		return n, WrapErrno(err)
	}
	return n, nil
}

// Getpid returns the process id.
func Getpid() int { return unix.Getpid() }

// OpenRDWR opens path read-write and close-on-exec.
func OpenRDWR(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, Errorf(asErrno(err), "open %s", path)
	}
	return fd, nil
}

// asErrno extracts the Errno of a failed system call.
func asErrno(err error) Errno {
	var e Errno
	if errors.As(err, &e) {
		return e
	}
	return EIO
}
