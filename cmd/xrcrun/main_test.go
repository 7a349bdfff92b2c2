package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// startHCA runs `xrcrun hca` on a free loopback address until the test
// ends, and returns its name and a function that stops it and returns what
// run returned.
func startHCA(t *testing.T, name string, extra ...string) func() error {
	t.Helper()
	for range 20 {
		addr := fmt.Sprintf("127.%d.%d.%d", 64+rand.IntN(64), rand.IntN(256), 1+rand.IntN(254))
		ctx, cancel := context.WithCancel(context.Background())
		var stderr bytes.Buffer
		done := make(chan error, 1)
		args := append([]string{"hca", "--procs", "0", "--name", name, "--addr", addr}, extra...)
		go func() { done <- run(ctx, args, os.Stdout, &stderr) }()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
			if _, err := softhca.QueryCounters(ctx, "", name); err == nil {
				stop := sync.OnceValue(func() error { cancel(); return <-done })
				t.Cleanup(func() { stop() })
				return stop
			}
			select {
			case err := <-done:
				cancel()
				if errors.Is(err, syscall.EADDRINUSE) {
					goto next
				}
				t.Fatalf("hca: %v\n%s", err, stderr.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("hca does not serve\n%s", stderr.String())
			}
		}
	next:
	}
	t.Fatal("no free loopback address")
	return nil
}

func TestHCAAndDevices(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(softhca.RuntimeDirEnv, dir)
	stop := startHCA(t, "soft7")

	var out bytes.Buffer
	if err := run(context.Background(), []string{"devices", "-v"}, &out, os.Stderr); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"hca_id:\tsoft7\n", "\ttransport:\t\t\tInfiniBand (0)\n", "\tnode_guid:\t\t\t", "\tmax_qp:\t\t\t\t",
		"\tmax_srq:\t\t\t", "\tdevice_cap_flags:\t\t0x", "\t\t\t\t\tRC_RNR_NAK_GEN\n", "\t\tport:\t1\n",
		"\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n", "\t\t\tactive_mtu:\t\t4096 (5)\n", "\t\t\tlink_layer:\t\tEthernet\n", "\t\t\tGID[  0]:\t\t"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("devices output lacks %q:\n%s", want, out.String())
		}
	}
	// Traffic through the device, so that its counters are not all 0:
	// a connected pair on it exchanges 100 SENDs.
	ctx := context.Background()
	env := verbstest.Env{Name: "soft7", Open: func(t testing.TB) (a, b *verbs.Context) {
		open := func() *verbs.Context {
			c, err := verbs.Open(ctx, "soft7", verbs.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		return open(), open()
	}}
	t.Run("Traffic", func(t *testing.T) { // its objects go at its end, before the device
		a, b := verbstest.Connect(t, env, 4096)
		for i := range 100 {
			if err := b.QP.PostRecv(&verbs.RecvWR{WRID: uint64(i), SG: []verbs.SGE{b.MR.SGE(0, 64)}}); err != nil {
				t.Fatal(err)
			}
			if err := a.QP.PostSend(&verbs.SendWR{WRID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
				SG: []verbs.SGE{a.MR.SGE(0, 64)}}); err != nil {
				t.Fatal(err)
			}
			for _, cq := range []*verbs.CQ{a.CQ, b.CQ} {
				wc := make([]verbs.WorkCompletion, 1)
				for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Microsecond) {
					if n, err := cq.Poll(wc); err != nil || n == 1 && wc[0].Status != verbs.WCSuccess {
						t.Fatalf("completion %+v, %v", wc[0], err)
					} else if n == 1 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("no completion")
					}
				}
			}
		}
	})
	// The printed values lie between the device's before and after (a
	// late packet may move them in between).
	before, err := softhca.QueryCounters(ctx, "", "soft7")
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(ctx, []string{"devices", "-v", "-d", "soft7"}, &out, os.Stderr); err != nil {
		t.Fatal(err)
	}
	counters, err := softhca.QueryCounters(ctx, "", "soft7")
	if err != nil {
		t.Fatal(err)
	}
	low := map[string]uint64{}
	for _, c := range before {
		low[c.Name] = c.Value
	}
	printed := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if name, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && strings.HasPrefix(line, "\t\t\t\t") {
			printed[name] = strings.TrimSpace(v)
		}
	}
	value := map[string]uint64{}
	for _, c := range counters {
		value[c.Name] = c.Value
		if c.Name == "objects_clients" {
			continue // devices itself was one more while it printed
		}
		if got, err := strconv.ParseUint(printed[c.Name], 10, 64); err != nil || got < low[c.Name] || got > c.Value {
			t.Errorf("devices -v prints %s: %q, the device says %d before and %d after", c.Name, printed[c.Name], low[c.Name], c.Value)
		}
	}
	for _, name := range []string{"port_xmit_data", "port_xmit_packets", "port_rcv_data", "port_rcv_packets",
		"port_rcv_errors", "local_ack_timeout_err", "rnr_nak_retry_err", "packet_seq_err", "duplicate_request",
		"out_of_sequence", "implied_nak_seq_err", "objects_qps"} {
		if _, ok := printed[name]; !ok {
			t.Errorf("devices -v prints no %s:\n%s", name, out.String())
		}
	}
	// port_xmit_data counts 4-byte words of whole packets: a SEND of 64
	// bytes over IPv4 is 20+8+12+64+4 bytes.
	if value["port_xmit_packets"] < 200 || value["port_rcv_packets"] < 200 || value["port_xmit_data"] < 100*108/4 {
		t.Errorf("counters after 100 SENDs of 64 bytes and their ACKs on a pair: %v", value)
	}
	if err := run(context.Background(), []string{"devices", "-d", "nosuch"}, &out, os.Stderr); err == nil ||
		err.Error() != "IB device 'nosuch' wasn't found" {
		t.Errorf("devices -d nosuch: %v", err)
	}
	// A second device of the same name is refused while the first runs.
	err = run(context.Background(), []string{"hca", "--name", "soft7", "--addr", "127.0.0.1"}, os.Stdout, &out)
	if err == nil || !strings.Contains(err.Error(), "already") {
		t.Errorf("second soft7: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("hca stopped with %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "soft7.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
}

// TestStaleSocket: a socket left by a device that died does not stop a new
// one of the same name.
func TestStaleSocket(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(softhca.RuntimeDirEnv, dir)
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(dir, "soft8.sock"), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	startHCA(t, "soft8")
}

// TestNoDevices: with no device, devices fails as ibv_devinfo does, and
// prints nothing on stdout.
func TestNoDevices(t *testing.T) {
	t.Setenv(softhca.RuntimeDirEnv, t.TempDir())
	if devs, _ := verbs.Devices(context.Background()); len(devs) > 0 {
		t.Skipf("this machine has devices: %v", devs)
	}
	for _, args := range [][]string{{"devices"}, {"devices", "-v"}} {
		var out bytes.Buffer
		err := run(context.Background(), args, &out, os.Stderr)
		if !errors.Is(err, errNoDevices) || out.Len() > 0 {
			t.Errorf("xrcrun %q: %v, stdout %q", args, err, out.String())
		}
	}
	// With -d, ibv_devinfo looks for the device among none, and says it
	// was not found (devinfo.c, main).
	var out bytes.Buffer
	if err := run(context.Background(), []string{"devices", "-d", "nosuch"}, &out, os.Stderr); err == nil ||
		err.Error() != "IB device 'nosuch' wasn't found" || out.Len() > 0 {
		t.Errorf("xrcrun devices -d nosuch: %v, stdout %q", err, out.String())
	}
}

func TestUsage(t *testing.T) {
	var errb bytes.Buffer
	for _, args := range [][]string{nil, {"nosuch"}, {"hca"}, {"hca", "--name", "x"}, {"hca", "--name", "x", "--addr", "nonsense"},
		{"hca", "--name", "x", "--addr", "127.0.0.1", "extra"}} {
		if err := run(context.Background(), args, os.Stdout, &errb); err == nil {
			t.Errorf("xrcrun %q succeeded", args)
		}
	}
}

// TestSubcommandBadFlag: a bad flag of xrcrun hca or xrcrun devices is one
// line of error, as the launcher's is (docs/xrcrun.md, Flags), and not the
// flag package's message and usage followed by the same message again from
// main; -h still prints the usage.
func TestSubcommandBadFlag(t *testing.T) {
	for _, args := range [][]string{{"hca", "--bogus"}, {"hca", "--mtu", "x"}, {"devices", "--bogus"}, {"devices", "-i", "x"}} {
		var errb bytes.Buffer
		err := run(context.Background(), args, io.Discard, &errb)
		want := "(xrcrun " + args[0] + " -h lists the flags)"
		if err == nil || !strings.HasSuffix(err.Error(), want) || errb.Len() > 0 {
			t.Errorf("xrcrun %q: error %v, want one ending %q; stderr %q, want none", args, err, want, errb.String())
		}
	}
	for _, cmd := range []string{"hca", "devices"} {
		var errb bytes.Buffer
		err := run(context.Background(), []string{cmd, "-h"}, io.Discard, &errb)
		if !errors.Is(err, flag.ErrHelp) || !strings.HasPrefix(errb.String(), "usage: xrcrun "+cmd) {
			t.Errorf("xrcrun %s -h: %v, stderr %q", cmd, err, errb.String())
		}
	}
}
