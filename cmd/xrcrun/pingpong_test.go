package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
)

// startHCAProcess runs `xrcrun hca` as a process of its own, serving in
// dir, on a free loopback address, until the test ends: it then gets
// SIGINT, must exit 0 and leave no socket.
func startHCAProcess(t *testing.T, xrcrun, dir, name string) {
	t.Helper()
	h := serveHCAProcess(t, xrcrun, dir, name)
	t.Cleanup(func() {
		h.cmd.Process.Signal(os.Interrupt)
		select {
		case err := <-h.exited:
			if err != nil {
				t.Errorf("xrcrun hca %s after SIGINT: %v\n%s", name, err, h.stderr.String())
			}
		case <-time.After(time.Minute):
			h.cmd.Process.Kill()
			t.Errorf("xrcrun hca %s still runs a minute after SIGINT\n%s", name, h.stderr.String())
			<-h.exited
		}
		if _, err := os.Stat(h.sock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("xrcrun hca %s left its socket: %v", name, err)
		}
	})
}

// hcaProcess is an `xrcrun hca` process that serves: exited gets its
// Wait's result, sock is its socket's path.
type hcaProcess struct {
	cmd    *exec.Cmd
	exited chan error
	stderr *lockedBuffer
	sock   string
}

// serveHCAProcess starts `xrcrun hca` serving device name in dir, on a
// free loopback address (it tries others while the one it drew is taken),
// and returns once its socket is there. The process dies with the test's
// (Pdeathsig); ending it is the caller's.
func serveHCAProcess(t *testing.T, xrcrun, dir, name string) *hcaProcess {
	t.Helper()
	sock := filepath.Join(dir, name+".sock")
	for range 20 {
		addr := fmt.Sprintf("127.0.%d.%d", 100+rand.IntN(100), 1+rand.IntN(250))
		h := &hcaProcess{cmd: exec.Command(xrcrun, "hca", "--name", name, "--addr", addr),
			exited: make(chan error, 1), stderr: &lockedBuffer{}, sock: sock}
		h.cmd.Env = append(os.Environ(), softhca.RuntimeDirEnv+"="+dir)
		h.cmd.Stderr = h.stderr
		h.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := h.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { h.exited <- h.cmd.Wait() }()
		if serving(t, h, name) {
			return h
		}
	}
	t.Fatal("no free loopback address")
	return nil
}

// serving waits for h's socket; it reports false if h exited because its
// address was taken, and fails the test if it exited otherwise or does not
// serve within a minute.
func serving(t *testing.T, h *hcaProcess, name string) bool {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-h.exited:
			if strings.Contains(h.stderr.String(), "address already in use") {
				return false
			}
			t.Fatalf("xrcrun hca %s: %v\n%s", name, err, h.stderr.String())
		default:
		}
		if _, err := os.Stat(h.sock); err == nil {
			return true
		}
		if time.Now().After(deadline) {
			h.cmd.Process.Kill()
			<-h.exited
			t.Fatalf("xrcrun hca %s does not serve\n%s", name, h.stderr.String())
		}
	}
}

// lockedBuffer is a bytes.Buffer that exec may write while a test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestPingpongOverHCAs runs examples/rc_pingpong's server and client
// attached to two `xrcrun hca` processes, and both to one of them: each
// prints its summary lines, and the client's pages check out (-c).
func TestPingpongOverHCAs(t *testing.T) {
	xrcrun, _ := tools(t)
	pingpong := filepath.Join(binDir, "rc_pingpong")
	dir := t.TempDir()
	a, b := fmt.Sprintf("ppa%d", os.Getpid()), fmt.Sprintf("ppb%d", os.Getpid())
	startHCAProcess(t, xrcrun, dir, a)
	startHCAProcess(t, xrcrun, dir, b)
	summary := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^\d+ bytes in \d+\.\d\d seconds = \d+\.\d\d Mbit/sec$`),
		regexp.MustCompile(`(?m)^\d+ iters in \d+\.\d\d seconds = \d+\.\d\d usec/iter$`),
	}
	for _, tc := range []struct{ name, server, client string }{{"TwoHCAs", a, b}, {"OneHCA", a, a}} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
			l.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang fails
			defer cancel()
			run := func(args ...string) (*exec.Cmd, *bytes.Buffer) {
				var out bytes.Buffer
				cmd := exec.CommandContext(ctx, pingpong, args...)
				cmd.Env = append(os.Environ(), softhca.RuntimeDirEnv+"="+dir)
				cmd.Stdout, cmd.Stderr = &out, &out
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				return cmd, &out
			}
			server, sout := run("-d", tc.server, "-p", port, "-n", "200", "-s", "65536", "-c")
			var client *exec.Cmd
			var cout *bytes.Buffer
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				client, cout = run("-d", tc.client, "-p", port, "-n", "200", "-s", "65536", "-c", "127.0.0.1")
				if err := client.Wait(); err == nil || time.Now().After(deadline) {
					break // else the server was not listening yet
				}
			}
			if err := server.Wait(); err != nil {
				t.Fatalf("server: %v\n%s\nclient:\n%s", err, sout, cout)
			}
			for who, out := range map[string]*bytes.Buffer{"server": sout, "client": cout} {
				for _, re := range summary {
					if !re.Match(out.Bytes()) {
						t.Errorf("%s's output lacks %s:\n%s", who, re, out)
					}
				}
				if bytes.Contains(out.Bytes(), []byte("invalid data")) {
					t.Errorf("%s:\n%s", who, out)
				}
			}
		})
	}
}
