package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/xrcrun/xrc/internal/unix"
)

// tempDirs are the temporary directories this process made and has not
// removed yet. Deferred removals do not run when a second signal ends the
// launcher at once (os.Exit), so main removes what is left first.
//
// A process killed outright (SIGKILL, or an agent whose launcher was)
// removes nothing. So each directory holds a lock file, locked (a shared
// flock) by its maker for as long as it lives, and by the node agents
// that use a launcher's directory (holdTempDir); the kernel drops a lock
// when its holder dies, however: the next makeTempDir of any xrcrun of
// this user on the same host removes the directories whose lock nobody
// holds
// (sweepTempDirs). The lock file names the host: where TMPDIR is shared
// between hosts whose flock locks are their own (NFS with local_lock), a
// sweep does not take another host's live directory. On a filesystem
// without flock, directories go without a lock and are never swept.
var tempDirs struct {
	sync.Mutex
	m      map[string]*os.File // directory: its lock file, or nil
	closed bool                // removeTempDirs ran: the process is exiting
	swept  bool
}

// tempPrefix starts the name of every temporary directory of xrcrun.
const tempPrefix = "xrcrun-"

// lockName is the lock file of a temporary directory; it gets that name
// only once locked, so that a sweep never finds it unlocked while its
// maker lives.
const lockName = ".xrcrun-lock"

// makeTempDir makes a temporary directory, as os.MkdirTemp("", pattern)
// with pattern starting with tempPrefix, and returns it with the func
// that removes it.
func makeTempDir(pattern string) (string, func(), error) {
	tempDirs.Lock()
	if !tempDirs.swept {
		tempDirs.swept = true
		sweepTempDirs(os.TempDir(), nil)
	}
	tempDirs.Unlock()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, err
	}
	lock, err := lockDir(dir)
	if unix.NoLocks(err) {
		lock, err = nil, nil // no flock here: no lock, no sweep
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	tempDirs.Lock()
	defer tempDirs.Unlock()
	if tempDirs.closed {
		os.RemoveAll(dir)
		closeLock(lock)
		return "", nil, errors.New("xrcrun is exiting")
	}
	if tempDirs.m == nil {
		tempDirs.m = map[string]*os.File{}
	}
	tempDirs.m[dir] = lock
	return dir, func() {
		tempDirs.Lock()
		delete(tempDirs.m, dir)
		tempDirs.Unlock()
		os.RemoveAll(dir)
		closeLock(lock)
	}, nil
}

func closeLock(f *os.File) {
	if f != nil {
		f.Close()
	}
}

// lockDir makes dir's lock file, locked, naming this host, and returns
// it open: the lock lasts until it is closed or this process ends. (Go
// opens files close-on-exec, so the ranks do not inherit it.)
func lockDir(dir string) (*os.File, error) {
	tmp := filepath.Join(dir, lockName+".new")
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.TryLock(f, false); err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("lock %s: %w", tmp, err)
	}
	if _, err := f.WriteString(hostname()); err != nil {
		f.Close()
		return nil, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, lockName)); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// holdTempDir takes a shared lock on dir, a temporary directory another
// xrcrun made, so that no sweep removes it while this process uses it,
// even once its maker is gone. It returns the func that lets it go, and
// why it holds nothing: a directory without a lock file (a filesystem
// without flock), or one swept already (its maker died first).
func holdTempDir(dir string) (func(), error) {
	f, err := os.Open(filepath.Join(dir, lockName))
	if err != nil {
		return func() {}, err
	}
	if err := unix.TryLock(f, false); err != nil {
		f.Close()
		return func() {}, err
	}
	return func() { f.Close() }, nil
}

// sweepTempDirs removes the directories of xrcrun in root whose maker has
// died: those of this user whose lock file nobody holds. Directories
// without a lock file (being made, or made by an older xrcrun) stay. It
// calls removed, if not nil, with each directory it removes.
func sweepTempDirs(root string, removed func(dir string)) {
	dirs, _ := filepath.Glob(filepath.Join(root, tempPrefix+"*"))
	uid := os.Getuid()
	for _, dir := range dirs {
		fi, err := os.Lstat(dir)
		if err != nil || !fi.IsDir() || int(fi.Sys().(*syscall.Stat_t).Uid) != uid {
			continue
		}
		f, err := os.Open(filepath.Join(dir, lockName))
		if err != nil {
			continue
		}
		host := make([]byte, 256)
		n, _ := f.Read(host)
		if string(host[:n]) == hostname() && unix.TryLock(f, true) == nil {
			// Its maker is gone; the lock, held while removing, keeps
			// another sweep from racing this one.
			os.RemoveAll(dir)
			if removed != nil {
				removed(dir)
			}
		}
		f.Close()
	}
}

// hostname names this host in lock files.
func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "?"
	}
	return h
}

// removeTempDirs removes the temporary directories left, before an exit
// that skips the deferred removals.
func removeTempDirs() {
	tempDirs.Lock()
	defer tempDirs.Unlock()
	tempDirs.closed = true
	for dir, lock := range tempDirs.m {
		os.RemoveAll(dir)
		closeLock(lock)
		delete(tempDirs.m, dir)
	}
}
