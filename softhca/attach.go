//go:build linux

package softhca

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
	"github.com/xrcrun/xrc/mlx4"
	"github.com/xrcrun/xrc/verbs"
)

// Attach connects this process to the device service called name (see
// Device.Serve) whose socket is in dir ("" means RuntimeDir()), and returns
// the kernel side that the mlx4 provider drives. Closing it disconnects,
// and the device destroys what the connection created.
func Attach(ctx context.Context, dir, name string) (mlx4.Kernel, error) {
	k, err := dial(ctx, dir, name)
	if err != nil {
		return nil, err
	}
	if err := k.bounded(ctx, k.hello); err != nil {
		k.conn.Close()
		return nil, fmt.Errorf("softhca: attach to %s: %w", name, err)
	}
	return k, nil
}

// bounded runs f, whose requests fail once ctx ends: a device that
// accepts the connection and never answers (stopped, stuck) must not
// hang the caller, as it did a listing of the devices.
func (k *remoteKernel) bounded(ctx context.Context, f func() error) error {
	if ctx.Done() == nil {
		return f()
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		k.conn.SetDeadline(time.Unix(1, 0)) // in the past: reads and writes fail at once
		close(fired)
	})
	err := f()
	if !stop() {
		<-fired
		k.conn.SetDeadline(time.Time{})
		if err != nil {
			err = fmt.Errorf("%w (%w)", context.Cause(ctx), err)
		}
	}
	return err
}

// remoteKernel is a client of a device in another process.
type remoteKernel struct {
	name string
	conn *net.UnixConn

	mu     sync.Mutex // one request at a time; guards what follows
	buf    []byte
	oob    []byte
	events map[int32]int // event fds the device passed, by id, until EventFile
	closed bool

	info  deviceInfo
	bells *bellProducer // and the bell ring's mapping, which Close unmaps
}

func dial(ctx context.Context, dir, name string) (*remoteKernel, error) {
	if dir == "" {
		dir = RuntimeDir()
	}
	path, err := socketPath(dir, name)
	if err != nil {
		return nil, err
	}
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unixpacket", path)
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("softhca: device %s: %w (%w)", name, context.Cause(ctx), err)
	}
	if err != nil && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) {
		// The socket is there, or the path cannot be reached (EACCES,
		// ENOTDIR, a socket of another type): not a device that is
		// simply not running.
		return nil, fmt.Errorf("softhca: device %s: connect to %s: %w", name, path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("softhca: no device %s in %s (is `xrcrun hca --name %s` running? %s sets the directory): %w",
			name, dir, name, RuntimeDirEnv, verbs.ErrNoDevice)
	}
	// The device gets this process's memory: it must be this user's
	// (or root's), not a socket another user put in its place.
	cred, err := unix.PeerCred(c.(*net.UnixConn))
	if err == nil && cred.UID != unix.Geteuid() && cred.UID != 0 {
		err = unix.Errorf(unix.EACCES, "the socket %s is served by user %d, not by this user (%d) or root", path, cred.UID, unix.Geteuid())
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("softhca: device %s: %w", name, err)
	}
	return &remoteKernel{name: name, conn: c.(*net.UnixConn), buf: make([]byte, maxMessage),
		oob: make([]byte, unix.RightsSpace(4)), events: map[int32]int{}}, nil
}

// call sends a request with fds and returns the body of its reply (valid
// until the next call) and the descriptors it passed, which the caller owns.
// Caller holds k.mu.
func (k *remoteKernel) call(t msgType, req []byte, fds ...int) ([]byte, []int, error) {
	if k.closed {
		return nil, nil, goneError{unix.Errorf(unix.EIO, "device %s: closed", k.name)}
	}
	if _, _, err := k.conn.WriteMsgUnix(req, unix.Rights(fds...), nil); err != nil {
		return nil, nil, goneError{unix.Errorf(unix.EIO, "device %s is gone: %v", k.name, err)}
	}
	n, oobn, _, _, err := k.conn.ReadMsgUnix(k.buf, k.oob)
	if err == nil && n == 0 {
		err = errors.New("connection closed")
	}
	if err != nil {
		return nil, nil, goneError{unix.Errorf(unix.EIO, "device %s is gone: %v", k.name, err)}
	}
	got, ferr := unix.ParseRights(k.oob[:oobn])
	body, err := parseReply(k.buf[:n], t)
	if err == nil {
		err = ferr
	}
	if err != nil {
		closeFDs(got)
		return nil, nil, err
	}
	return body, got, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// hello makes the connection a client: the device checks it can reach this
// process's memory, and passes the bell ring and its eventfd.
func (k *remoteKernel) hello() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	probe := new([16]byte)
	rand.Read(probe[:])
	h := hello{version: protoVersion, probe: uint64(uintptr(unsafe.Pointer(probe))), nonce: *probe}
	body, fds, err := k.call(msgHello, h.append(nil))
	runtime.KeepAlive(probe)
	if err != nil {
		return err
	}
	if k.info, err = parseDeviceInfo(body); err != nil || len(fds) != 2 {
		closeFDs(fds)
		return unix.Errorf(unix.EPROTO, "hello reply with %d descriptors: %v", len(fds), err)
	}
	defer unix.Close(fds[0])
	ring, err := unix.MmapShared(fds[0], 0, bellSize)
	if err != nil {
		unix.Close(fds[1])
		return err
	}
	k.bells = &bellProducer{r: newBellRing(ring), kick: fds[1], gone: func() bool { return unix.PeerClosed(k.conn) }}
	return nil
}

func (k *remoteKernel) Name() string { return k.name }

// Yield gives this thread's CPU away when a poller finds its CQ empty. The
// device is a process on the same CPUs: a client spinning on its CQ could
// otherwise keep the device waiting for the CPU until the scheduler's time
// slice ends, milliseconds later.
func (k *remoteKernel) Yield() { unix.SchedYield() }

// PacksQueues: the device reads queues at any 64-byte-aligned address and
// fetches a send WQE only once it is posted (mlx4.Packer).
func (k *remoteKernel) PacksQueues() bool { return true }

// Write sends a uverbs command; the device writes its response into this
// process's memory, as the kernel would, before it replies.
func (k *remoteKernel) Write(cmd []byte) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	req := append(appendRequest(nil, msgCommand), cmd...)
	pass, err := xrcdFile(cmd)
	if err != nil {
		return 0, err
	}
	body, fds, err := k.call(msgCommand, req, pass...)
	if err != nil {
		return 0, err
	}
	ids, err := parseIDs(body)
	if err != nil || len(ids) != len(fds) {
		closeFDs(fds)
		return 0, unix.Errorf(unix.EPROTO, "command reply with %d ids and %d descriptors: %v", len(ids), len(fds), err)
	}
	for i, id := range ids {
		if old, ok := k.events[id]; ok {
			unix.Close(old)
		}
		k.events[id] = fds[i]
	}
	return len(cmd), nil
}

func (k *remoteKernel) MapUAR() (mlx4.UAR, error) { return remoteUAR{k.bells}, nil }

// ShareRegion passes the device the memfd of the verbs.Alloc memory that
// holds [addr, addr+n), so that it reaches the region being registered
// there with plain copies instead of process_vm_readv/writev. Other memory
// is not shared.
func (k *remoteKernel) ShareRegion(addr uintptr, n uint64) error {
	fd, base, size, ok := verbs.AllocFile(addr, n)
	if !ok {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	_, fds, err := k.call(msgAddRegion, appendRequest(nil, msgAddRegion, uint64(base), uint64(size)), fd)
	closeFDs(fds)
	return err
}

// AllocQueue makes memfd memory and shares it with the device.
func (k *remoteKernel) AllocQueue(n int) ([]byte, error) {
	fd, b, err := unix.Memfd("xrc-queue", n)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	k.mu.Lock()
	defer k.mu.Unlock()
	_, fds, err := k.call(msgAddQueue, appendRequest(nil, msgAddQueue, uint64(unix.AddrOf(b)), uint64(cap(b))), fd)
	closeFDs(fds)
	if err != nil {
		unix.Munmap(b)
		return nil, err
	}
	return b, nil
}

// FreeQueue stops sharing queue memory and unmaps it.
func (k *remoteKernel) FreeQueue(b []byte) error {
	k.mu.Lock()
	_, fds, err := k.call(msgRemoveQueue, appendRequest(nil, msgRemoveQueue, uint64(unix.AddrOf(b))))
	closeFDs(fds)
	k.mu.Unlock()
	if errors.As(err, new(goneError)) {
		// The device is gone, and its mapping of the memory with it.
		err = nil
	}
	return errors.Join(err, unix.Munmap(b))
}

// goneError is the error of a call to a device that is gone (its process
// exited or stopped serving, or the client closed): EIO, as the kernel
// answers the commands of a context it disassociated from a removed
// device. Freeing memory the device shared then only unmaps it here.
type goneError struct{ error }

func (e goneError) Unwrap() error { return e.error }

func (k *remoteKernel) EventFile(id int32, name string) (*os.File, error) {
	k.mu.Lock()
	fd, ok := k.events[id]
	delete(k.events, id)
	k.mu.Unlock()
	if !ok {
		return nil, unix.Errorf(unix.EBADF, "device %s passed no event file %d", k.name, id)
	}
	if err := unix.SetNonblock(fd); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), k.name+"-"+name), nil
}

func (k *remoteKernel) QueryGID(port uint8, index int) (verbs.GID, error) {
	if port != 1 || index != 0 {
		return verbs.GID{}, unix.Errorf(unix.EINVAL, "gid %d of port %d", index, port)
	}
	return k.info.gid, nil
}

// Close disconnects; the device destroys what the client left.
func (k *remoteKernel) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	k.closed = true
	err := k.conn.Close()
	for id, fd := range k.events {
		unix.Close(fd)
		delete(k.events, id)
	}
	if k.bells != nil {
		// Closing the connection ends a doorbell waiting for room (gone),
		// and close waits for it to leave the ring.
		unix.Munmap(k.bells.close())
		unix.Close(k.bells.kick)
	}
	return err
}

// remoteUAR rings doorbells through the bell ring.
type remoteUAR struct{ p *bellProducer }

func (u remoteUAR) Write32(off int, v uint32) { u.p.ring(off, uint64(v)) }
func (u remoteUAR) Write64(off int, v uint64) { u.p.ring(off, v) }
func (u remoteUAR) Close() error              { return nil }

// QueryCounters returns the counters of the device service called name in
// dir ("" means RuntimeDir()): the port and error counters, named as sysfs
// names them, then its object counts (objects_qps, ...) and the pieces of
// its clients' memory it maps (client_mappings).
func QueryCounters(ctx context.Context, dir, name string) ([]Counter, error) {
	body, err := ask(ctx, dir, name, msgCounters)
	if err != nil {
		return nil, err
	}
	return parseCounters(body)
}

// serviceInfo asks the device service called name for its description.
func serviceInfo(ctx context.Context, dir, name string) (deviceInfo, error) {
	body, err := ask(ctx, dir, name, msgInfo)
	if err != nil {
		return deviceInfo{}, err
	}
	return parseDeviceInfo(body)
}

// ask sends a request that needs no client (no hello) on a connection of
// its own and returns the reply's body.
func ask(ctx context.Context, dir, name string, t msgType) ([]byte, error) {
	k, err := dial(ctx, dir, name)
	if err != nil {
		return nil, err
	}
	defer k.conn.Close()
	var body []byte
	err = k.bounded(ctx, func() error {
		k.mu.Lock()
		defer k.mu.Unlock()
		var fds []int
		var err error
		body, fds, err = k.call(t, appendRequest(nil, t))
		closeFDs(fds)
		return err
	})
	return body, err
}

// xrcdFile returns the descriptor to pass with a command: the file an
// OPEN_XRCD command names (none for fd -1), which the device keys the
// domain by. Other commands pass none.
func xrcdFile(cmd []byte) ([]int, error) {
	hdr, ok := uverbs.Decode[uverbs.CmdHdr](cmd)
	if !ok || hdr.Command != uverbs.CmdOpenXRCD {
		return nil, nil
	}
	req, ok := uverbs.Decode[uverbs.OpenXRCD](cmd[uverbs.HdrSize:])
	if !ok || int32(req.FD) == -1 {
		return nil, nil // the device judges a short command
	}
	fd := int(int32(req.FD))
	if _, _, _, _, err := unix.FileStat(fd); err != nil {
		return nil, unix.Errorf(unix.EBADF, "open xrcd: descriptor %d: %v", fd, err)
	}
	return []int{fd}, nil
}
