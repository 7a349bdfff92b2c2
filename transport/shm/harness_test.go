package shm

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// recordingTB is a testing.TB whose failures and cleanups are kept for the
// test that uses it to look at: Fatal ends the goroutine that calls it, as
// testing's does, and Cleanup's functions run when runCleanups says.
type recordingTB struct {
	testing.TB
	mu       sync.Mutex
	errs     []string
	cleanups []func()
}

func (r *recordingTB) Helper() {}

func (r *recordingTB) record(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, s)
}

func (r *recordingTB) Error(args ...any)                 { r.record(fmt.Sprint(args...)) }
func (r *recordingTB) Errorf(format string, args ...any) { r.record(fmt.Sprintf(format, args...)) }
func (r *recordingTB) Fatal(args ...any)                 { r.record(fmt.Sprint(args...)); runtime.Goexit() }
func (r *recordingTB) Fatalf(format string, args ...any) {
	r.record(fmt.Sprintf(format, args...))
	runtime.Goexit()
}

func (r *recordingTB) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

func (r *recordingTB) runCleanups() {
	r.mu.Lock()
	fs := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// TestPeerHarnessFailedPull: a cross-process test whose Pull fails (as
// under Yama ptrace_scope 2; here the address is one the peer never
// offered) fails with the Pull's error, and its cleanup ends the peer
// process, which still holds the buffer it offered. Before, the cleanup's
// empty frame only released the buffer, and the cleanup waited for the
// peer to exit forever: the test hung instead of failing.
func TestPeerHarnessFailedPull(t *testing.T) {
	rt := &recordingTB{TB: t}
	var pp *peerPair
	body := make(chan struct{})
	go func() {
		defer close(body)
		pp = startPeer(rt)
		_, n := pp.requestPull(rt, 1<<16)
		if err := Pull(pp.cmd.Process.Pid, 0, make([]byte, n)); err != nil {
			rt.Fatal(err)
		}
		rt.Fatal("a pull of address 0 succeeded")
	}()
	<-body
	cleaned := make(chan struct{})
	go func() {
		defer close(cleaned)
		rt.runCleanups()
	}()
	select {
	case <-cleaned:
	case <-time.After(2 * peerPatience):
		if pp != nil {
			pp.cmd.Process.Kill()
		}
		<-cleaned
		t.Fatalf("the harness hung after a failed pull (peer killed); failures: %q", rt.errs)
	}
	if len(rt.errs) != 1 || !strings.Contains(rt.errs[0], "process_vm_readv") && !strings.Contains(rt.errs[0], "address") {
		t.Fatalf("failures %q, want the pull's error alone", rt.errs)
	}
	t.Logf("the harness failed with: %s", rt.errs[0])
}
