package main

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestHCASecondSignalRemovesSocket: a second signal ends xrcrun hca at
// once, and its socket goes with it, as with one signal. The second signal
// called os.Exit before the device had removed its socket, which stayed
// behind. The process is stopped while the two signals are sent, so that
// both are pending when it runs again, as when a user presses Ctrl-C twice
// on a loaded machine.
func TestHCASecondSignalRemovesSocket(t *testing.T) {
	xrcrun, _ := tools(t)
	h := serveHCAProcess(t, xrcrun, t.TempDir(), "soft-2sig")
	// Both signals pending at once: two different ones, since a second of
	// the same kind would merge with the first.
	for _, s := range []syscall.Signal{syscall.SIGSTOP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCONT} {
		if err := h.cmd.Process.Signal(s); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-h.exited: // at once (the second signal) or after the first's cleanup
	case <-time.After(time.Minute):
		h.cmd.Process.Kill()
		<-h.exited
		t.Fatalf("xrcrun hca still runs a minute after two signals\n%s", h.stderr.String())
	}
	if _, err := os.Stat(h.sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("xrcrun hca left its socket after two signals: %v\n%s", err, h.stderr.String())
	}
}
