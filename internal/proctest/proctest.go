// Package proctest runs a test binary again as other processes, for tests
// that need real processes (device clients, ranks of a job): the child
// runs with -test.run=^$, so that only its TestMain's role for it runs.
package proctest

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
)

// Proc is the test binary running in another process.
type Proc struct {
	Cmd  *exec.Cmd
	done chan struct{}
}

// Start starts the test binary with env added to this process's
// environment and its standard output to out (standard error if nil); its
// standard error is this process's. The child is killed if it is still
// running when the test ends, and when this process dies (Pdeathsig).
func Start(t testing.TB, env []string, out io.Writer) *Proc {
	t.Helper()
	if out == nil {
		out = os.Stderr
	}
	p := &Proc{Cmd: exec.Command(os.Args[0], "-test.run=^$"), done: make(chan struct{})}
	p.Cmd.Env = append(os.Environ(), env...)
	p.Cmd.Stdout, p.Cmd.Stderr = out, os.Stderr
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.Cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.Cmd.Process.Kill(); <-p.done })
	return p
}

// Done is closed when the process has exited; Cmd.ProcessState then says
// how.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Buffer is a buffer a process writes while a test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
