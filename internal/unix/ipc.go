//go:build linux

package unix

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// What a device service and its clients share between processes: memfd
// memory, eventfds, descriptors passed over unix sockets, and the peer's
// credentials.

// Memfd creates an anonymous shared-memory file of n bytes (rounded up to
// pages), close-on-exec, and maps it shared and read-write. The caller owns
// both the descriptor and the mapping. The file's size is sealed: a
// process it is passed to may map it (Sealed) without the one who passed
// it shrinking the file under the mapping, whose next access would then
// kill the mapper with SIGBUS.
func Memfd(name string, n int) (int, []byte, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, Error(asErrno(err), "memfd_create")
	}
	size := roundPage(n)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, nil, Error(asErrno(err), "ftruncate memfd")
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return -1, nil, Error(asErrno(err), "seal memfd")
	}
	b, err := MmapShared(fd, 0, size)
	if err != nil {
		unix.Close(fd)
		return -1, nil, err
	}
	return fd, b[:n], nil
}

// Sealed reports an error unless the file fd refers to cannot shrink: a
// memfd sealed so, as Memfd makes them.
func Sealed(fd int) error {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return Error(asErrno(err), "the file is not a sealed memfd")
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return Error(unix.EPERM, "the memfd may shrink: it is not sealed against it")
	}
	return nil
}

// FileStat returns the size of the file fd refers to, and its device's
// major and minor numbers and its inode number: what identifies a file
// however it was opened (and how /proc/PID/maps names it).
func FileStat(fd int) (size int64, major, minor uint32, ino uint64, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, 0, 0, 0, Error(asErrno(err), "fstat")
	}
	return st.Size, unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino, nil
}

// TryLock takes a shared, or with exclusive an exclusive, flock of f
// without waiting: EWOULDBLOCK if another holds it. The lock lasts until f
// is closed.
func TryLock(f *os.File, exclusive bool) error {
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	if err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB); err != nil {
		return Error(asErrno(err), "flock")
	}
	return nil
}

// NoLocks reports whether err, of TryLock, says that the file system has
// no flock.
func NoLocks(err error) bool {
	return errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOLCK)
}

// Dup returns a close-on-exec duplicate of fd.
func Dup(fd int) (int, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, Error(asErrno(err), "dup")
	}
	return nfd, nil
}

// Eventfd creates a non-blocking, close-on-exec eventfd.
func Eventfd() (int, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return -1, Error(asErrno(err), "eventfd")
	}
	return fd, nil
}

// Signal adds one to an eventfd's counter, waking its reader. An eventfd
// whose counter is full (EAGAIN) has a wake-up pending already.
func Signal(fd int) error {
	one := [8]byte{1}
	_, err := unix.Write(fd, one[:])
	if err != nil && err != unix.EAGAIN {
		return Error(asErrno(err), "signal eventfd")
	}
	return nil
}

// Drain reads and so resets a non-blocking eventfd's counter. It reports
// whether the counter was set (a signal came since the last Drain); false
// with a nil error means there was none.
func Drain(fd int) (bool, error) {
	var b [8]byte
	for {
		_, err := unix.Read(fd, b[:])
		switch err {
		case nil:
			return true, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false, nil
		}
		return false, Error(asErrno(err), "read eventfd")
	}
}

// Cred is the identity of a unix socket's peer, taken when it connected.
type Cred struct {
	PID, UID, GID int
}

// PeerCred returns the credentials (SO_PEERCRED) of the peer of a
// connected unix socket.
func PeerCred(c syscall.Conn) (Cred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return Cred{}, err
	}
	var uc *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		uc, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, err
	}
	if serr != nil {
		return Cred{}, Error(asErrno(serr), "SO_PEERCRED")
	}
	return Cred{PID: int(uc.Pid), UID: int(uc.Uid), GID: int(uc.Gid)}, nil
}

// PeerClosed reports whether the peer of a connected stream or seqpacket
// unix socket has closed its end, without taking anything from the socket
// or waiting.
func PeerClosed(c syscall.Conn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	var b [1]byte
	if err := rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		closed = err == nil && n == 0 || err != nil && err != unix.EAGAIN && err != unix.EINTR
		return true
	}); err != nil {
		return true // closed here
	}
	return closed
}

// HungUp reports whether the peer of the connected unix socket fd has
// closed its end (POLLHUP), without taking anything from the socket or
// waiting.
func HungUp(fd int) bool {
	pfd := []unix.PollFd{{Fd: int32(fd)}}
	n, err := unix.Poll(pfd, 0)
	for err == unix.EINTR {
		n, err = unix.Poll(pfd, 0)
	}
	return err == nil && n == 1 && pfd[0].Revents&unix.POLLHUP != 0
}

// WatchExit calls exited, in a goroutine of its own, once process pid
// has exited, unless stop is called first. The watch holds a pidfd, which
// names the process itself, not its number: a process that takes the
// number over later does not count.
func WatchExit(pid int, exited func()) (stop func(), err error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err == unix.EINVAL { // before Linux 5.10: no PIDFD_NONBLOCK
		if fd, err = unix.PidfdOpen(pid, 0); err == nil {
			unix.CloseOnExec(fd)
			if err = unix.SetNonblock(fd, true); err != nil {
				unix.Close(fd)
			}
		}
	}
	if err != nil {
		return nil, Error(asErrno(err), "pidfd_open")
	}
	// A pidfd polls readable once its process has exited; the runtime's
	// poller waits for that.
	f := os.NewFile(uintptr(fd), "pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	go func() {
		if err := rc.Read(func(fd uintptr) bool {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(pfd, 0)
			for err == unix.EINTR {
				n, err = unix.Poll(pfd, 0)
			}
			return err == nil && n == 1
		}); err == nil {
			exited()
		}
	}()
	return func() { f.Close() }, nil
}

// WaitExited waits for process pid, a child, to exit without reaping it,
// so that its number (and its process group's) is not reused until it is.
func WaitExited(pid int) error {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			if err != nil {
				return Errorf(asErrno(err), "waitid %d", pid)
			}
			return nil
		}
	}
}

// Geteuid returns the effective user id.
func Geteuid() int { return unix.Geteuid() }

// Rights returns the control message that passes fds over a unix socket.
func Rights(fds ...int) []byte {
	if len(fds) == 0 {
		return nil
	}
	return unix.UnixRights(fds...)
}

// ParseRights returns the descriptors a control message passed. The caller
// owns them, even when it also gets an error.
func ParseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, Error(asErrno(err), "parse control message")
	}
	var fds []int
	var errs error
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		f, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			errs = Error(asErrno(err), "parse SCM_RIGHTS")
			continue
		}
		fds = append(fds, f...)
	}
	return fds, errs
}

// RightsSpace is the control-message room needed to receive n descriptors.
func RightsSpace(n int) int { return unix.CmsgSpace(n * 4) }

// SchedYield gives the CPU to another runnable thread, if any. It is a raw
// system call, as the Go runtime's own yield in its spin loops is: with
// the runtime's system call bookkeeping, a yield that lets another process
// run for a while would make the runtime hand this thread's P to another
// thread and take it back afterwards, which in a loop of yields costs more
// than the polling they separate (between two emulated nodes, a third of
// the 1 MiB bandwidth of bench/osu).
func SchedYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// AllowPeerReads lets other processes of this user read this process's
// memory with process_vm_readv where the Yama LSM restricts ptrace to
// ancestors (ptrace_scope 1): prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY).
// Without Yama the call fails and changes nothing, which is fine: the
// ordinary same-user rule applies then. Scopes 2 and 3 still refuse.
func AllowPeerReads() {
	unix.Prctl(unix.PR_SET_PTRACER, unix.PR_SET_PTRACER_ANY, 0, 0, 0)
}
