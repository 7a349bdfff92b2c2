//go:build linux

package softhca

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/xrcrun/xrc/internal/unix"
)

// Serve makes the device a service for the processes of this machine: it
// listens on the unix socket <dir>/<name>.sock (dir "" means RuntimeDir())
// until ctx is done or the device closes. Each connection is one client, as
// an open of the uverbs file is: its commands are the uverbs write commands
// the kernel takes, its queues live in memfd memory both processes map, its
// doorbells go through a bell ring, and the device moves data to and from
// its memory with process_vm_readv/writev. Only the device's own user and
// root may connect (SO_PEERCRED). A client that disconnects or dies has
// all its objects destroyed.
//
// When Serve stops it puts every QP of the device in the error state (the
// clients see their work flushed and an IBV_EVENT_DEVICE_FATAL), closes the
// connections and removes the socket. It returns nil when ctx ended it.
func (d *Device) Serve(ctx context.Context, dir string) error {
	if dir == "" {
		dir = RuntimeDir()
	}
	path, err := socketPath(dir, d.name)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("softhca: runtime directory: %w", err)
	}
	if err := checkRuntimeDir(dir); err != nil {
		return err
	}
	if err := removeStale(path); err != nil {
		return err
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("softhca: listen: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	d.log.Info("serving", "socket", path)

	stopped := make(chan struct{})
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(func() { close(stopped); ln.Close() }) }
	forget := serving.add(stop)
	defer forget()
	go func() {
		select {
		case <-ctx.Done():
		case <-d.gone:
		case <-stopped:
		}
		stop()
	}()

	var (
		mu       sync.Mutex
		sessions = map[*session]struct{}{}
		wg       sync.WaitGroup
	)
	var acceptErr error
	var pause time.Duration // before the next accept, after one failed for want of resources
	for {
		conn, err := ln.AcceptUnix()
		if err != nil && outOfResources(err) {
			// Clients can take the descriptors (each connection and
			// completion channel holds some): the device and they carry
			// on, and the connection waits in the backlog until some
			// are free.
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			d.log.Warn("accept failed; trying again", "err", err, "in", pause)
			select {
			case <-stopped:
			case <-time.After(pause):
				continue
			}
		}
		if err != nil {
			select {
			case <-stopped:
			default:
				acceptErr = fmt.Errorf("softhca: accept: %w", err)
			}
			break
		}
		pause = 0
		s := &session{d: d, conn: conn}
		mu.Lock()
		sessions[s] = struct{}{}
		mu.Unlock()
		wg.Go(func() {
			s.run()
			mu.Lock()
			delete(sessions, s)
			mu.Unlock()
		})
	}
	stop()
	d.mu.Lock()
	if !d.closed {
		d.fail()
	}
	d.mu.Unlock()
	mu.Lock()
	for s := range sessions {
		s.conn.Close()
	}
	mu.Unlock()
	wg.Wait()
	d.log.Info("stopped serving", "socket", path)
	return acceptErr
}

// serving holds the services this process runs, for RemoveSockets.
var serving stopSet

// stopSet holds the stop functions of running services.
type stopSet struct {
	sync.Mutex
	next  int
	stops map[int]func()
}

// add registers stop until the returned function is called.
func (s *stopSet) add(stop func()) (forget func()) {
	s.Lock()
	defer s.Unlock()
	if s.stops == nil {
		s.stops = map[int]func(){}
	}
	id := s.next
	s.next++
	s.stops[id] = stop
	return func() {
		s.Lock()
		delete(s.stops, id)
		s.Unlock()
	}
}

// RemoveSockets stops the device services of this process from taking
// connections and removes their sockets, as the end of their contexts
// would, at once: for a process about to exit without waiting for Serve to
// return (xrcrun hca on a second SIGINT), which would leave its socket
// behind. It waits for nothing else; the services' Serve calls then wind
// down as when their contexts end.
func RemoveSockets() {
	serving.Lock()
	defer serving.Unlock()
	for _, stop := range serving.stops {
		stop()
	}
}

// outOfResources reports whether accept failed for want of descriptors
// or memory, which later accepts may find again.
func outOfResources(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// removeStale removes a socket left behind by a device process that died,
// and fails if a live device answers on it.
func removeStale(path string) error {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	c, err := net.Dial("unixpacket", path)
	if err == nil {
		c.Close()
		return fmt.Errorf("softhca: a device is already served at %s", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("softhca: %s exists and is not a device socket: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("softhca: remove stale socket: %w", err)
	}
	return nil
}

// startKick creates the eventfd that a client of another process signals
// when the engine sleeps, and a goroutine that wakes the engine on it.
// Each client has its own: a client can read the eventfd it holds as well
// as signal it, and would take the wake-ups of the clients it shared one
// with. Closing the returned file, whose descriptor is fd, stops the
// goroutine.
func (d *Device) startKick() (*os.File, int, error) {
	fd, err := unix.Eventfd()
	if err != nil {
		return nil, -1, fmt.Errorf("softhca: %w", err)
	}
	f := os.NewFile(uintptr(fd), d.name+"-kick")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, -1, fmt.Errorf("softhca: %w", err)
	}
	go func() {
		// One read per wake-up: take the signal, wake the engine, and
		// wait for the next one (false: wait, then call again) rather
		// than read again to find the eventfd empty, as a loop of
		// f.Read would. Closing f ends the wait with an error.
		rc.Read(func(fd uintptr) bool {
			got, err := unix.Drain(int(fd))
			if got {
				d.eng.kick()
			}
			return err != nil
		})
	}()
	return f, fd, nil
}
