// Package hcatest runs software HCAs in processes of their own for tests:
// a test binary calls Main from its TestMain, and Start re-executes the
// binary as a device process that serves a device on a free loopback
// address until the test ends.
package hcatest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/mlx4"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

// envServe names the device a re-executed test binary serves:
// name,addr,dir.
const envServe = "XRC_HCATEST_SERVE"

// EnvDebug, when set in a test's environment, makes device processes log at
// debug level, with microsecond times, to the test's stderr.
const EnvDebug = "XRC_HCATEST_DEBUG"

// EnvSpin sets the devices' Config.SpinIdle (a duration; 0 or negative:
// never spin). By default they spin as xrcrun hca does: softhca.ProcessSpinIdle,
// yielding the CPU between polls.
const EnvSpin = "XRC_HCATEST_SPIN"

// EnvCPUProfile, when set in a test's environment, makes each device
// process write a CPU profile to its value followed by "." and the device
// name.
const EnvCPUProfile = "XRC_HCATEST_CPUPROFILE"

// exitAddrInUse tells Start to try another address.
const exitAddrInUse = 3

// Main runs the device process role if this process was started as one,
// and then exits; otherwise it returns. Call it first in TestMain.
func Main() {
	spec := os.Getenv(envServe)
	if spec == "" {
		return
	}
	os.Exit(serve(spec))
}

func serve(spec string) int {
	f := strings.Split(spec, ",")
	if len(f) != 3 {
		fmt.Fprintf(os.Stderr, "hcatest: bad %s=%q\n", envServe, spec)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	runtime.GOMAXPROCS(1) // as xrcrun hca runs: one engine, no idle Ps to wake
	cfg := softhca.Config{Name: f[0], Addr: netip.MustParseAddr(f[1]), UDP: true, SpinIdle: softhca.ProcessSpinIdle, SpinYield: true}
	if d, err := time.ParseDuration(os.Getenv(EnvSpin)); err == nil {
		cfg.SpinIdle = d
		if d == 0 {
			cfg.SpinIdle = -1 // as xrcrun hca --spin 0: never (softhca's 0 is its default)
		}
	}
	if os.Getenv(EnvDebug) != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug,
			ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					a.Value = slog.StringValue(a.Value.Time().Format("15:04:05.000000"))
				}
				return a
			}}))
	}
	if p := os.Getenv(EnvCPUProfile); p != "" {
		if f, err := os.Create(p + "." + f[0]); err == nil {
			pprof.StartCPUProfile(f)
			defer pprof.StopCPUProfile()
		}
	}
	d, err := softhca.New(ctx, cfg)
	if errors.Is(err, syscall.EADDRINUSE) {
		return exitAddrInUse
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer d.Close()
	if err := d.Serve(ctx, f[2]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

var seq atomic.Uint32

// Service is a device process started by a test.
type Service struct {
	Name, Dir string
	Addr      netip.Addr
	cmd       *exec.Cmd
	// terminated: the test sent SIGTERM itself (Signal), and the end of
	// the test sends none: a second one, coming after the device process
	// let go of the first one's handler on its way out, would kill it.
	terminated atomic.Bool
}

// Start runs a device in a process of its own, on a free address of
// 127.64.0.0/10, serving in dir, and stops it (SIGTERM) when the test
// ends, checking that it exits cleanly and leaves no socket behind.
func Start(t testing.TB, dir string) *Service {
	t.Helper()
	for range 20 {
		s := &Service{Name: fmt.Sprintf("softp%d-%d", os.Getpid(), seq.Add(1)), Dir: dir,
			Addr: netip.AddrFrom4([4]byte{127, 64 + byte(rand.IntN(64)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})}
		s.cmd = exec.Command(os.Args[0], "-test.run=^$")
		s.cmd.Env = append(os.Environ(), envServe+"="+s.Name+","+s.Addr.String()+","+dir)
		s.cmd.Stderr = os.Stderr
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := s.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- s.cmd.Wait() }()
		up, err := s.waitUp(exited)
		if !up && s.cmd.ProcessState != nil && s.cmd.ProcessState.ExitCode() == exitAddrInUse {
			continue
		}
		if !up {
			t.Fatalf("device process %s: %v", s.Name, err)
		}
		t.Cleanup(func() { s.stop(t, exited) })
		return s
	}
	t.Fatal("hcatest: no free loopback address")
	return nil
}

// waitUp waits until the device answers on its socket, or its process
// exits.
func (s *Service) waitUp(exited chan error) (bool, error) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		select {
		case err := <-exited:
			return false, fmt.Errorf("exited: %v", err)
		case <-time.After(2 * time.Millisecond):
		}
		if _, err := softhca.QueryCounters(context.Background(), s.Dir, s.Name); err == nil {
			return true, nil
		}
	}
	s.cmd.Process.Kill()
	return false, errors.New("not serving after 30 s")
}

func (s *Service) stop(t testing.TB, exited chan error) {
	if !s.terminated.Load() {
		s.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("device process %s: %v", s.Name, err)
		}
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		t.Errorf("device process %s did not stop on SIGTERM", s.Name)
	}
	if _, err := os.Stat(filepath.Join(s.Dir, s.Name+".sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket of %s left behind: %v", s.Name, err)
	}
}

// Signal sends sig to the device's process: SIGSTOP and SIGCONT stall it
// as a loaded machine would. The process may go on running a while after
// SIGSTOP: Stop waits until it has stopped.
func (s *Service) Signal(sig os.Signal) error {
	if sig == syscall.SIGTERM {
		s.terminated.Store(true)
	}
	return s.cmd.Process.Signal(sig)
}

// Stop sends SIGSTOP to the device's process and waits until every thread
// of it has stopped. The kernel stops a process's threads one after the
// other once one of them has taken the signal, which on a loaded machine
// may run only milliseconds later; meanwhile the device goes on working.
func (s *Service) Stop(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	tasks := filepath.Join("/proc", fmt.Sprint(s.cmd.Process.Pid), "task")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Microsecond) {
		if stoppedThreads(tasks) {
			return
		}
		if time.Now().After(deadline) {
			s.cmd.Process.Signal(syscall.SIGCONT)
			t.Fatalf("device process %s did not stop within 10 s of SIGSTOP", s.Name)
		}
	}
}

// stoppedThreads says whether every thread listed in tasks, a process's
// /proc/PID/task, is stopped (or dead).
func stoppedThreads(tasks string) bool {
	ents, err := os.ReadDir(tasks)
	if err != nil {
		return false
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(tasks, e.Name(), "stat"))
		if err != nil {
			continue // the thread has gone
		}
		// The state follows the command, in parentheses that it may
		// itself contain.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) == 0 || !strings.ContainsAny(f[0], "TtZX") {
			return false
		}
	}
	return true
}

// Counters reads the device's counters and object counts by name.
func (s *Service) Counters(t testing.TB) map[string]uint64 {
	t.Helper()
	cs, err := softhca.QueryCounters(context.Background(), s.Dir, s.Name)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]uint64{}
	for _, c := range cs {
		m[c.Name] = c.Value
	}
	return m
}

// Attach opens a context on the device. When the test ends it closes it
// and checks that the device holds no objects (after a disconnect the
// device needs a moment to notice).
func (s *Service) Attach(t testing.TB) *verbs.Context {
	t.Helper()
	c := s.Open(t)
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
		s.WaitClean(t)
	})
	return c
}

// Open opens a context on the device, which the caller closes: Attach
// without its checks, for a test whose device goes away.
func (s *Service) Open(t testing.TB) *verbs.Context {
	t.Helper()
	k, err := softhca.Attach(context.Background(), s.Dir, s.Name)
	if err != nil {
		t.Fatal(err)
	}
	p, err := mlx4.Open(k)
	if err != nil {
		k.Close()
		t.Fatal(err)
	}
	return verbs.NewContext(s.Name, p, verbs.Config{})
}

// WaitClean waits until the device holds no PD, MR, CQ, SRQ or QP, and
// fails the test after 10 seconds. Clients may still be attached.
func (s *Service) WaitClean(t testing.TB) map[string]uint64 {
	t.Helper()
	return s.waitCounts(t, "objects", func(m map[string]uint64) bool {
		return m["objects_qps"]+m["objects_cqs"]+m["objects_mrs"]+m["objects_pds"]+m["objects_srqs"] == 0
	})
}

// WaitIdle waits until the device serves no client and holds no object
// (XRC domains included), and fails the test after 10 seconds. A process
// that destroys its objects and then exits leaves the device holding
// nothing but the client, until the device has read the end of its
// connection.
func (s *Service) WaitIdle(t testing.TB) map[string]uint64 {
	t.Helper()
	return s.waitCounts(t, "clients or objects", func(m map[string]uint64) bool {
		var n uint64
		for k, v := range m {
			if strings.HasPrefix(k, "objects_") {
				n += v
			}
		}
		return n == 0
	})
}

// waitCounts polls the device's counters until done holds of them, for up
// to 10 seconds, and returns the last reading.
func (s *Service) waitCounts(t testing.TB, what string, done func(map[string]uint64) bool) map[string]uint64 {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		m := s.Counters(t)
		if done(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Errorf("%s still holds %s: %v", s.Name, what, m)
			return m
		}
	}
}
