package softhca_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/mlx4"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/softhca/hcatest"
	"github.com/xrcrun/xrc/verbs"
)

// TestXRCLifetimes follows the device's objects as two clients share a
// domain and a receive QP: the QP outlives its creator's handle and the
// creator itself while the other client holds it open, goes with the last
// opener, and the domain goes with its last reference, even when that
// reference's client just disappears.
func TestXRCLifetimes(t *testing.T) {
	d := newDevice(t, nil)
	f, err := os.Create(filepath.Join(t.TempDir(), "domain"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := func(what string, qps, xrcds int) {
		t.Helper()
		if o := d.Objects(); o.QPs != qps || o.XRCDs != xrcds {
			t.Fatalf("%s: %d QPs and %d XRC domains, want %d and %d", what, o.QPs, o.XRCDs, qps, xrcds)
		}
	}

	creator, err := d.Open(verbs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	x1, err := creator.OpenXRCD(f, os.O_CREATE)
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := x1.CreateTgtQP()
	if err != nil {
		t.Fatal(err)
	}
	num := tgt.Num()
	if num&(1<<23) == 0 {
		t.Errorf("receive QP number %#x lacks the XRC bit mlx4 sets", num)
	}

	// The other client: a provider whose kernel side will just go away.
	k, err := d.Kernel()
	if err != nil {
		t.Fatal(err)
	}
	p, err := mlx4.Open(k)
	if err != nil {
		t.Fatal(err)
	}
	x2, err := p.OpenXRCD(int(f.Fd()), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.OpenXRCQP(x2, num, 1); err != nil {
		t.Fatal(err)
	}
	want("shared", 1, 1)
	if err := x1.Close(); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("close of a domain handle with a QP: %v", err)
	}

	// The creator lets go of everything: the QP stays, held by the other.
	if err := tgt.Close(); err != nil {
		t.Fatal(err)
	}
	if err := x1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := creator.Close(); err != nil {
		t.Fatal(err)
	}
	want("after the creator left", 1, 1)

	// The holder's client goes away without closing anything: its opener
	// was the last, and its handle the domain's last reference.
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	p.Close()
	want("after the last holder left", 0, 0)

	// A new domain of the same file is a new one: the old QP is gone.
	c := open(t, d)
	x3, err := c.OpenXRCD(f, os.O_CREATE|os.O_EXCL)
	if err != nil {
		t.Fatalf("O_EXCL open after the domain went away: %v", err)
	}
	if _, err := x3.OpenQP(num); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("open of the destroyed QP: %v", err)
	}
	if err := x3.Close(); err != nil {
		t.Fatal(err)
	}
	want("at the end", 0, 0)
}

const (
	envXRCClient = "XRC_TEST_XRC_CLIENT" // device name: open the domain of envXRCFile, make a receive QP, wait
	envXRCFile   = "XRC_TEST_XRC_FILE"
)

// xrcClientForTest creates a receive QP in the domain of a file, prints its
// number and waits to be killed.
func xrcClientForTest(name string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := verbs.Open(context.Background(), name, verbs.Config{})
	if err != nil {
		return fail(err)
	}
	f, err := os.Open(os.Getenv(envXRCFile))
	if err != nil {
		return fail(err)
	}
	x, err := c.OpenXRCD(f, os.O_CREATE)
	if err != nil {
		return fail(err)
	}
	qp, err := x.CreateTgtQP()
	if err != nil {
		return fail(err)
	}
	fmt.Printf("qpn %d\n", qp.Num())
	select {} // until killed
}

// TestXRCCreatorKilled kills the process that made a receive QP while this
// one holds it open: the QP and the domain stay, passed by file between
// the processes; closing them here frees them.
func TestXRCCreatorKilled(t *testing.T) {
	dir := t.TempDir()
	s := hcatest.Start(t, dir)
	path := filepath.Join(dir, "domain")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c := attach(t, s)
	before := s.Counters(t)

	cmd, out := startClient(t, envXRCClient+"="+s.Name, envXRCFile+"="+path, softhca.RuntimeDirEnv+"="+dir)
	defer cmd.Wait()
	defer cmd.Process.Kill()
	var num uint32
	if _, err := fmt.Fscanf(bufio.NewReader(out), "qpn %d\n", &num); err != nil {
		t.Fatalf("client: %v", err)
	}

	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	x, err := c.OpenXRCD(f, 0) // the child's domain: no O_CREATE needed
	if err != nil {
		t.Fatal(err)
	}
	qp, err := x.OpenQP(num)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	wantCounts(t, s, "after the creator was killed", map[string]uint64{
		"objects_clients": before["objects_clients"], "objects_qps": before["objects_qps"] + 1,
		"objects_xrcds": before["objects_xrcds"] + 1,
	})
	if err := qp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, s, "after the last opener closed", map[string]uint64{
		"objects_qps": before["objects_qps"], "objects_xrcds": before["objects_xrcds"],
	})
}

// wantCounts waits until the device's counters hold want.
func wantCounts(t *testing.T, s *hcatest.Service, what string, want map[string]uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		got := s.Counters(t)
		same := true
		for k, v := range want {
			same = same && got[k] == v
		}
		if same {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: counters %v, want %v", what, got, want)
		}
	}
}
