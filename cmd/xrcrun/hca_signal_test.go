package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
)

// TestHCASecondSignalRemovesSocket: a second signal ends xrcrun hca at
// once, and its socket goes with it, as with one signal. The second signal
// called os.Exit before the device had removed its socket, which stayed
// behind. The process is stopped while the two signals are sent, so that
// both are pending when it runs again, as when a user presses Ctrl-C twice
// on a loaded machine.
func TestHCASecondSignalRemovesSocket(t *testing.T) {
	xrcrun, _ := tools(t)
	dir := t.TempDir()
	name := "soft-2sig"
	sock := filepath.Join(dir, name+".sock")
	for range 20 {
		addr := fmt.Sprintf("127.0.%d.%d", 100+rand.IntN(100), 1+rand.IntN(250))
		var stderr lockedBuffer
		cmd := exec.Command(xrcrun, "hca", "--name", name, "--addr", addr)
		cmd.Env = append(os.Environ(), softhca.RuntimeDirEnv+"="+dir)
		cmd.Stderr = &stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
			select {
			case err := <-exited:
				if strings.Contains(stderr.String(), "address already in use") {
					goto next
				}
				t.Fatalf("xrcrun hca: %v\n%s", err, stderr.String())
			default:
			}
			if _, err := os.Stat(sock); err == nil {
				break
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				<-exited
				t.Fatalf("xrcrun hca does not serve\n%s", stderr.String())
			}
		}
		// Both signals pending at once: two different ones, since a
		// second of the same kind would merge with the first.
		for _, s := range []syscall.Signal{syscall.SIGSTOP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCONT} {
			if err := cmd.Process.Signal(s); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-exited: // at once (the second signal) or after the first's cleanup
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			<-exited
			t.Fatalf("xrcrun hca still runs a minute after two signals\n%s", stderr.String())
		}
		if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("xrcrun hca left its socket after two signals: %v\n%s", err, stderr.String())
		}
		return
	next:
	}
	t.Fatal("no free loopback address")
}
