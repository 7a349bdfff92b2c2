package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/xrcrun/xrc/internal/proctest"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/softhca/hcatest"
	"github.com/xrcrun/xrc/verbs"
)

const (
	// envArgs makes the test binary run xsrq_pingpong with these arguments
	// (separated by spaces), so that server and clients are processes of
	// their own.
	envArgs = "XRC_XSRQ_ARGS"
	// envPause names a directory: the server creates "paused" in it before
	// its final handshake and waits there until "resume" exists.
	envPause = "XRC_XSRQ_PAUSE"
)

func TestMain(m *testing.M) {
	hcatest.Main()
	if a := os.Getenv(envArgs); a != "" {
		if dir := os.Getenv(envPause); dir != "" {
			testHookTermination = func() { pause(dir) }
		}
		if err := run(context.Background(), strings.Fields(a), os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// pause tells the test the server is about to end and waits to be let go.
func pause(dir string) {
	os.WriteFile(filepath.Join(dir, "paused"), nil, 0o600)
	for {
		if _, err := os.Stat(filepath.Join(dir, "resume")); err == nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var (
	addrLine = regexp.MustCompile(`(?m)^ *(local|remote): (LID [0-9a-f]{4}, QPN RECV [0-9a-f]{6} SEND [0-9a-f]{6}, PSN [0-9a-f]{6}, SRQN [0-9a-f]{6}), GID ::ffff:127\.\d+\.\d+\.\d+$`)
	success  = regexp.MustCompile(`\nsuccess\n\z`)
)

// TestNodes runs a server on one device process and its clients on
// another, as two nodes. While every process holds its objects, the
// devices' object counts are those of XRC: on each node one XRC domain
// (the clients' three processes share one), one XRC SRQ per process, and
// a receive and a send QP per connection. The server sends each client's
// messages through the QPs of all clients in turn, so the runs succeed
// only if a receive QP delivers to the SRQ of another process of its
// domain.
func TestNodes(t *testing.T) {
	dir := t.TempDir()
	a, b := hcatest.Start(t, dir), hcatest.Start(t, dir)
	file := filepath.Join(dir, "xrc_domain")
	for _, tc := range []struct {
		name    string
		clients int
		args    string
	}{
		{"ThreeClients", 3, "-n 20 -s 4096"},
		{"TwoClientsEvents", 2, "-e -n 10 -s 65536 -m 2048"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pauseDir := t.TempDir()
			port := freePort(t)
			common := fmt.Sprintf("-p %d -xrcd-file %s %s", port, file, tc.args)
			srv := start(t, dir, pauseDir, fmt.Sprintf("-d %s -c %d %s", a.Name, tc.clients, common))
			waitListening(t, port, srv)
			var clis []*proc
			for range tc.clients {
				clis = append(clis, start(t, dir, "", fmt.Sprintf("-d %s %s 127.0.0.1", b.Name, common)))
			}
			waitFile(t, filepath.Join(pauseDir, "paused"), append(clis, srv)...)
			c := uint64(tc.clients)
			wantObjects(t, a, map[string]uint64{"objects_clients": 1, "objects_xrcds": 1, "objects_srqs": 1, "objects_qps": 2 * c})
			wantObjects(t, b, map[string]uint64{"objects_clients": c, "objects_xrcds": 1, "objects_srqs": c, "objects_qps": 2 * c})
			if err := os.WriteFile(filepath.Join(pauseDir, "resume"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			// What the server printed as a client's address is what that
			// client printed as its own, and the other way round.
			srvLocal, srvRemote := addrs(t, wait(t, srv), tc.clients)
			for _, cli := range clis {
				local, remote := addrs(t, wait(t, cli), 1)
				for l := range local {
					for r := range remote {
						if !srvRemote[l] || !srvLocal[r] {
							t.Errorf("client's addresses %q and %q are not among the server's %v and %v", l, r, srvRemote, srvLocal)
						}
					}
				}
			}
			for _, s := range []*hcatest.Service{a, b} {
				if m := s.WaitIdle(t); m["xrc_srq_errors"] != 0 {
					t.Errorf("%s after the run: %v", s.Name, m)
				}
			}
		})
	}
}

// addrs checks that a process printed n local and n remote address lines,
// and "success" last, and returns the sets of addresses it printed.
func addrs(t *testing.T, out string, n int) (local, remote map[string]bool) {
	t.Helper()
	local, remote = map[string]bool{}, map[string]bool{}
	for _, m := range addrLine.FindAllStringSubmatch(out, -1) {
		if m[1] == "local" {
			local[m[2]] = true
		} else {
			remote[m[2]] = true
		}
	}
	if len(local) != n || len(remote) != n || !success.MatchString(out) {
		t.Fatalf("want %d different local and remote address lines and success in\n%s", n, out)
	}
	return local, remote
}

// wantObjects checks the device's object counts.
func wantObjects(t *testing.T, s *hcatest.Service, want map[string]uint64) {
	t.Helper()
	got := s.Counters(t)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s = %d, want %d (all: %v)", s.Name, k, got[k], v, got)
		}
	}
}

// proc is an xsrq_pingpong process.
type proc struct {
	*proctest.Proc
	args string
	out  *proctest.Buffer
}

// start starts xsrq_pingpong in a process with the devices of dir; it is
// killed, if still running, when the test ends.
func start(t *testing.T, dir, pauseDir, args string) *proc {
	out := new(proctest.Buffer)
	return &proc{Proc: proctest.Start(t, []string{envArgs + "=" + args, softhca.RuntimeDirEnv + "=" + dir, envPause + "=" + pauseDir}, out),
		args: args, out: out}
}

// exited fails the test if p has exited.
func (p *proc) exited(t *testing.T) {
	t.Helper()
	select {
	case <-p.Done():
		t.Fatalf("%s exited: %v\n%s", p.args, p.Cmd.ProcessState, p.out)
	default:
	}
}

// wait waits for a process to exit successfully and returns its output.
func wait(t *testing.T, p *proc) string {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s does not end", p.args)
	}
	out := p.out.String()
	if !p.Cmd.ProcessState.Success() {
		t.Fatalf("%s: %v\n%s", p.args, p.Cmd.ProcessState, out)
	}
	t.Logf("%s", out)
	return out
}

// waitFile waits for path to exist while the processes run.
func waitFile(t *testing.T, path string, procs ...*proc) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		for _, p := range procs {
			p.exited(t)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s", path)
		}
	}
}

// waitListening waits until a socket listens on TCP port port, as
// /proc/net/tcp and tcp6 show (the server prints nothing before its
// first client connects).
func waitListening(t *testing.T, port int, srv *proc) {
	t.Helper()
	want := fmt.Sprintf(":%04X ", port)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			b, _ := os.ReadFile(f)
			for _, line := range strings.Split(string(b), "\n") {
				if fs := strings.Fields(line); len(fs) > 3 && strings.HasSuffix(fs[1]+" ", want) && fs[3] == "0A" {
					return
				}
			}
		}
		srv.exited(t)
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on port %d", port)
		}
	}
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestDestWire(t *testing.T) {
	d := dest{lid: 0x12, recvQPN: 0x800001, sendQPN: 0xabcdef, psn: 0x123456, srqn: 0x42,
		gid: verbs.GID{0: 0xfe, 1: 0x80, 15: 1}}
	msg := d.wire()
	if len(msg) != msgSize || string(msg[:65]) != "0012:800001:abcdef:123456:000042:fe800000000000000000000000000001" || msg[65] != 0 {
		t.Fatalf("wire form %q", msg)
	}
	got, err := parseDest(msg)
	if err != nil || got != d {
		t.Fatalf("parsed %+v, %v", got, err)
	}
	for _, bad := range []string{"0012:800001:abcdef:123456:zz", "0012:800001:abcdef:123456:1000000:fe800000000000000000000000000001",
		"0012:800001:abcdef:123456:000042:fe80000000000000000000000000000x"} {
		if _, err := parseDest([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	var out bytes.Buffer
	d.gid = verbs.GIDFromAddr(netip.MustParseAddr("127.0.1.2"))
	d.print(&out, "local")
	if want := "   local: LID 0012, QPN RECV 800001 SEND abcdef, PSN 123456, SRQN 000042, GID ::ffff:127.0.1.2\n"; out.String() != want {
		t.Fatalf("address line %q, want %q", out.String(), want)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-m", "1000"}, {"-c", "0"}, {"-n", "-1"}, {"-p", "70000"}, {"a", "b"}, {"-x"}} {
		var errb bytes.Buffer
		if err := run(context.Background(), args, &bytes.Buffer{}, &errb); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	o, err := parse([]string{"--clients", "4", "-num_tests", "7", "host"}, &bytes.Buffer{})
	if err != nil || o.clients != 1 || o.iters != 7 || o.server != "host" || o.mtu != verbs.MTU1024 {
		t.Fatalf("a client's options %+v, %v", o, err)
	}
	if err := run(context.Background(), []string{"-o"}, &bytes.Buffer{}, &bytes.Buffer{}); !errors.Is(err, verbs.ErrNotSupported) {
		t.Fatalf("-o: %v", err)
	}
}

// TestDefaults: with no flags, ibv_xsrq_pingpong's defaults (its init()
// and usage(): path MTU 1024 since rdma-core 0f93a1589, 2017).
func TestDefaults(t *testing.T) {
	o, err := parse(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := options{port: 18515, ibPort: 1, size: 4096, mtu: verbs.MTU1024, clients: 1, iters: 5, gidIdx: -1,
		xrcdFile: "/tmp/xrc_domain"}
	if *o != want {
		t.Errorf("defaults %+v, want %+v", *o, want)
	}
}
