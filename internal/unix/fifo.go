//go:build linux

package unix

import "golang.org/x/sys/unix"

// Mkfifo makes a FIFO at path with permissions perm (before the umask).
func Mkfifo(path string, perm uint32) error {
	if err := unix.Mkfifo(path, perm); err != nil {
		return Errorf(asErrno(err), "mkfifo %s", path)
	}
	return nil
}

// OpenFIFO opens the FIFO at path, non-blocking and close-on-exec: for
// reading and writing (a reader that never sees the end of the file, as it
// is a writer too), or for writing only (which fails with ENXIO while no
// process has the FIFO open for reading).
func OpenFIFO(path string, write bool) (int, error) {
	flags := unix.O_RDWR
	if write {
		flags = unix.O_WRONLY
	}
	fd, err := unix.Open(path, flags|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, Errorf(asErrno(err), "open %s", path)
	}
	return fd, nil
}

// Read reads from fd into b.
func Read(fd int, b []byte) (int, error) {
	n, err := unix.Read(fd, b)
	if err != nil {
		return n, WrapErrno(err)
	}
	return n, nil
}

// EpollCreate makes an epoll instance, non-blocking and close-on-exec.
func EpollCreate() (int, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return -1, Error(asErrno(err), "epoll_create1")
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, Error(asErrno(err), "set non-blocking")
	}
	return fd, nil
}

// EpollAdd adds fd to the epoll instance ep, readable (level-triggered).
func EpollAdd(ep, fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return Errorf(asErrno(err), "epoll_ctl add %d", fd)
	}
	return nil
}

// EpollMod sets fd's registration in the epoll instance ep again,
// readable (level-triggered). It fails with ENOENT if ep holds no
// registration of the file fd names now: one it held under that number
// went with its file's close, and the number names another file.
func EpollMod(ep, fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_MOD, fd, &ev); err != nil {
		return Errorf(asErrno(err), "epoll_ctl mod %d", fd)
	}
	return nil
}

// EpollDel removes fd from the epoll instance ep.
func EpollDel(ep, fd int) error {
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_DEL, fd, nil); err != nil {
		return Errorf(asErrno(err), "epoll_ctl del %d", fd)
	}
	return nil
}

// EpollEvent is a descriptor epoll found ready (struct epoll_event).
type EpollEvent = unix.EpollEvent

// EpollPoll fills evs with the descriptors of ep that are ready, without
// waiting, and returns how many.
func EpollPoll(ep int, evs []EpollEvent) (int, error) {
	for {
		n, err := unix.EpollWait(ep, evs, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, Error(asErrno(err), "epoll_wait")
		}
		return n, nil
	}
}
