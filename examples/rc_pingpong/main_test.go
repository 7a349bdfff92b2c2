package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/internal/proctest"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/softhca/hcatest"
	"github.com/xrcrun/xrc/verbs"
)

// envArgs makes the test binary run rc_pingpong with these arguments
// (separated by spaces), so that server and client are processes of their
// own.
const envArgs = "XRC_PINGPONG_ARGS"

func TestMain(m *testing.M) {
	hcatest.Main()
	if a := os.Getenv(envArgs); a != "" {
		if err := run(context.Background(), strings.Fields(a), os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// summary is what each side prints at the end.
var summary = []string{
	`(?m)^\d+ bytes in \d+\.\d\d seconds = \d+\.\d\d Mbit/sec$`,
	`(?m)^\d+ iters in \d+\.\d\d seconds = \d+\.\d\d usec/iter$`,
}

// TestDeviceProcesses runs server and client processes attached to device
// processes that speak RoCEv2 over UDP: one device each, and both on one.
func TestDeviceProcesses(t *testing.T) {
	dir := t.TempDir()
	a, b := hcatest.Start(t, dir), hcatest.Start(t, dir)
	for _, tc := range []struct {
		name           string
		server, client *hcatest.Service
		args           string
	}{
		{"TwoDevices", a, b, "-n 500 -s 4096 -c"},
		{"TwoDevicesEvents", a, b, "-e -n 200 -s 65536 -m 4096"},
		{"OneDevice", a, a, "-n 500 -s 8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := freePort(t)
			srv := startPingpong(t, dir, fmt.Sprintf("-d %s -p %d %s", tc.server.Name, port, tc.args))
			// The server prints its address, then listens.
			for deadline := time.Now().Add(10 * time.Second); !strings.Contains(srv.Stdout.(*proctest.Buffer).String(), "local address"); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the server does not start")
				}
			}
			time.Sleep(20 * time.Millisecond)
			cli := startPingpong(t, dir, fmt.Sprintf("-d %s -p %d %s 127.0.0.1", tc.client.Name, port, tc.args))
			for _, c := range []*exec.Cmd{cli, srv} {
				if err := c.Wait(); err != nil {
					t.Fatalf("%v: %v\n%s", c.Args, err, c.Stdout)
				}
				out := c.Stdout.(*proctest.Buffer).String()
				for _, re := range summary {
					if !regexp.MustCompile(re).MatchString(out) {
						t.Fatalf("no line matching %s in\n%s", re, out)
					}
				}
				if strings.Contains(out, "invalid data") {
					t.Fatal(out)
				}
				t.Logf("%s", out)
			}
		})
	}
}

// startPingpong starts rc_pingpong in a process with the devices of dir.
func startPingpong(t *testing.T, dir, args string) *exec.Cmd {
	c := exec.Command(os.Args[0], "-test.run=^$")
	c.Env = append(os.Environ(), envArgs+"="+args, softhca.RuntimeDirEnv+"="+dir)
	c.Stdout, c.Stderr = new(proctest.Buffer), os.Stderr
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill() })
	return c
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestSelf(t *testing.T) {
	for _, args := range [][]string{
		{"-self", "-n", "200", "-s", "64"},
		{"-self", "-n", "50", "-s", "100000", "-m", "2048", "-c"},
		{"-self", "-e", "-n", "100", "-s", "8"},
	} {
		var out, errb bytes.Buffer
		if err := run(context.Background(), args, &out, &errb); err != nil {
			t.Fatalf("%v: %v\n%s%s", args, err, out.String(), errb.String())
		}
		for _, re := range []string{
			`(?m)^  local address:  LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID ::ffff:127\.0\.1\.25[01]$`,
			`(?m)^\d+ bytes in \d+\.\d\d seconds = \d+\.\d\d Mbit/sec$`,
			`(?m)^\d+ iters in \d+\.\d\d seconds = \d+\.\d\d usec/iter$`,
		} {
			if n := len(regexp.MustCompile(re).FindAllString(out.String(), -1)); n != 2 {
				t.Fatalf("%v: %d lines match %s in\n%s", args, n, re, out.String())
			}
		}
		if bytes.Contains(out.Bytes(), []byte("invalid data")) {
			t.Fatalf("%v: %s", args, out.String())
		}
	}
}

// TestSelfSlowServer: with -self the client dials once; it must find the
// server's listener however long the server takes to set up (it dialled
// 50 ms after the start and failed with "couldn't connect" when the server
// was slower).
func TestSelfSlowServer(t *testing.T) {
	testHookExchange = func(server bool) error {
		if server {
			time.Sleep(300 * time.Millisecond)
		}
		return nil
	}
	defer func() { testHookExchange = nil }()
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"-self", "-n", "10", "-s", "64"}, &out, &errb); err != nil {
		t.Fatalf("-self with a server slow to set up: %v\n%s%s", err, out.String(), errb.String())
	}
}

// TestSelfClientFails: with -self, a client that fails ends the server,
// which waited for it in accept for ever, and the client's error is the
// one reported.
func TestSelfClientFails(t *testing.T) {
	errClient := errors.New("the client gives up")
	testHookExchange = func(server bool) error {
		if !server {
			return errClient
		}
		return nil
	}
	defer func() { testHookExchange = nil }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a guard against the hang
	defer cancel()
	var out, errb bytes.Buffer
	err := run(ctx, []string{"-self", "-n", "10", "-s", "64"}, &out, &errb)
	if !errors.Is(err, errClient) || !strings.HasPrefix(err.Error(), "client: ") || ctx.Err() != nil {
		t.Fatalf("-self with a failing client: %v (the guard's context: %v), want the client's error", err, ctx.Err())
	}
}

// -self -d DEV runs both sides on DEV, as ibv_rc_pingpong -d DEV does as
// server and client on one host; -d was ignored, so -d nosuchdev
// succeeded on the in-process HCAs. An unknown device is an error.
func TestSelfDevice(t *testing.T) {
	dir := t.TempDir()
	a := hcatest.Start(t, dir)
	t.Setenv(softhca.RuntimeDirEnv, dir)
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"-self", "-d", a.Name, "-n", "100", "-s", "64"}, &out, &errb); err != nil {
		t.Fatalf("-self -d %s: %v\n%s%s", a.Name, err, out.String(), errb.String())
	}
	gid := regexp.QuoteMeta("::ffff:" + a.Addr.String())
	for _, re := range append([]string{`(?m)^  local address:  LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID ` + gid + `$`}, summary...) {
		if n := len(regexp.MustCompile(re).FindAllString(out.String(), -1)); n != 2 {
			t.Fatalf("%d lines match %s in\n%s", n, re, out.String())
		}
	}
	out.Reset()
	for _, d := range []string{"-d", "--ib-dev"} {
		err := run(context.Background(), []string{"-self", d, "nosuchdev", "-n", "10"}, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), "nosuchdev") {
			t.Errorf("-self %s nosuchdev: %v\n%s", d, err, out.String())
		}
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-m", "1000"}, {"-n", "0"}, {"-p", "70000"}, {"-i", "256"}, {"-l", "16"},
		{"-g", "1"}, {"-g", "300"}, {"a", "b"}, {"-x"}, {"-self", "host"}} {
		if _, err := parse(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	o, err := parse([]string{"-g", "0", "-i", "1", "-l", "15", "host"}, &bytes.Buffer{})
	if err != nil || o.gidIdx != 0 || o.server != "host" || o.mtu != 1024 {
		t.Fatalf("options %+v, %v", o, err)
	}
}

// TestServerStalledPeer: a server whose peer connects and then sends
// nothing still ends when its context does (SIGINT, in main).
func TestServerStalledPeer(t *testing.T) {
	for _, stallAfter := range []int{0, 52} { // before its address, before "done"
		ctx, cancel := context.WithCancel(context.Background())
		port := freePort(t)
		done := make(chan error, 1)
		go func() {
			_, err := serverExchange(ctx, nil, port, dest{}, func(dest) error { return nil })
			done <- err
		}()
		var conn net.Conn
		for deadline := time.Now().Add(10 * time.Second); conn == nil; time.Sleep(5 * time.Millisecond) {
			c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err == nil {
				conn = c
			} else if time.Now().After(deadline) {
				t.Fatal(err)
			}
		}
		if stallAfter > 0 {
			if _, err := conn.Write(dest{qpn: 1}.wire()[:stallAfter]); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("stall after %d bytes: the exchange succeeded", stallAfter)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("stall after %d bytes: the server does not end with its context", stallAfter)
		}
		conn.Close()
	}
}

func TestDestWire(t *testing.T) {
	d := dest{lid: 0x12, qpn: 0xabcdef, psn: 0x123456, gid: verbs.GID{0: 0xfe, 1: 0x80, 15: 1}}
	msg := d.wire()
	if len(msg) != 52 || string(msg[:51]) != "0012:abcdef:123456:fe800000000000000000000000000001" || msg[51] != 0 {
		t.Fatalf("wire form %q", msg)
	}
	got, err := parseDest(msg)
	if err != nil || got != d {
		t.Fatalf("parsed %+v, %v", got, err)
	}
	if _, err := parseDest([]byte("0012:abcdef:123456:zz")); err == nil {
		t.Fatal("bad message parsed")
	}
}

// TestOtherFlags: ibv_rc_pingpong's flags beyond the basic ones (rdma-core
// libibverbs/examples/rc_pingpong.c, main and pp_init_ctx), with its
// checks of their combinations and its messages. No device here has
// on-demand paging, completion timestamps or device memory, so those fail
// as the C tool fails on such a device; -N (the other post API) and -U
// (memory for confidential-computing guests) change nothing here.
func TestOtherFlags(t *testing.T) {
	for _, args := range [][]string{{"-N", "-U"}, {"--new_send", "--allow-cc-unprotected", "host"}} {
		if _, err := parse(args, &bytes.Buffer{}); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
	for _, tc := range []struct {
		args []string
		want string // the error's text
	}{
		{[]string{"-o", "-j"}, "DM memory region can't be on demand"},
		{[]string{"-U", "-o"}, "CoCo unprotected memory cannot be used with ODP"},
		{[]string{"--allow-cc-unprotected", "--dm"}, "CoCo unprotected memory cannot be used with device memory"},
		{[]string{"-P"}, "prefetch is valid only with on-demand memory region"},
	} {
		if _, err := parse(tc.args, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	for _, args := range [][]string{{"-o"}, {"--odp"}, {"-O", "-P"}, {"--iodp"}, {"-t"}, {"--ts"}, {"-j"}, {"--dm"}} {
		if err := run(context.Background(), append(args, "-self"), &bytes.Buffer{}, &bytes.Buffer{}); !errors.Is(err, verbs.ErrNotSupported) {
			t.Errorf("%v: %v", args, err)
		}
	}
}
