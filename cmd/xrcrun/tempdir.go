package main

import (
	"os"
	"sync"
)

// tempDirs are the temporary directories this process made and has not
// removed yet. Deferred removals do not run when a second signal ends the
// launcher at once (os.Exit), so main removes what is left first.
var tempDirs struct {
	sync.Mutex
	m map[string]bool
}

// makeTempDir makes a temporary directory, as os.MkdirTemp("", pattern),
// and returns it with the func that removes it.
func makeTempDir(pattern string) (string, func(), error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, err
	}
	tempDirs.Lock()
	if tempDirs.m == nil {
		tempDirs.m = map[string]bool{}
	}
	tempDirs.m[dir] = true
	tempDirs.Unlock()
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
	for dir := range tempDirs.m {
		os.RemoveAll(dir)
		delete(tempDirs.m, dir)
	}
}
