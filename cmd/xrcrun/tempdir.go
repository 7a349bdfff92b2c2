package main

import (
	"errors"
	"os"
	"sync"
)

// tempDirs are the temporary directories this process made and has not
// removed yet. Deferred removals do not run when a second signal ends the
// launcher at once (os.Exit), so main removes what is left first.
var tempDirs struct {
	sync.Mutex
	m      map[string]bool
	closed bool // removeTempDirs ran: the process is exiting
}

// makeTempDir makes a temporary directory, as os.MkdirTemp("", pattern),
// and returns it with the func that removes it.
func makeTempDir(pattern string) (string, func(), error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, err
	}
	tempDirs.Lock()
	defer tempDirs.Unlock()
	if tempDirs.closed {
		os.RemoveAll(dir)
		return "", nil, errors.New("xrcrun is exiting")
	}
	if tempDirs.m == nil {
		tempDirs.m = map[string]bool{}
	}
	tempDirs.m[dir] = true
	return dir, func() {
		tempDirs.Lock()
		delete(tempDirs.m, dir)
		tempDirs.Unlock()
		os.RemoveAll(dir)
	}, nil
}

// removeTempDirs removes the temporary directories left, before an exit
// that skips the deferred removals.
func removeTempDirs() {
	tempDirs.Lock()
	defer tempDirs.Unlock()
	tempDirs.closed = true
	for dir := range tempDirs.m {
		os.RemoveAll(dir)
		delete(tempDirs.m, dir)
	}
}
