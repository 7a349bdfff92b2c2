package softhca_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/softhca/hcatest"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// The test binary doubles as a device process (hcatest) and as a client
// process: TestMain runs the role its environment names, so that these
// tests use real processes.
const envClient = "XRC_TEST_CLIENT" // name: attach (in XRC_RUNTIME_DIR), make objects, wait to be killed

func TestMain(m *testing.M) {
	hcatest.Main()
	if dir := os.Getenv(envSilent); dir != "" {
		os.Exit(silentDeviceMain(dir))
	}
	if mode := os.Getenv(envTCP); mode != "" {
		os.Exit(tcpPeer(mode))
	}
	if spec := os.Getenv(envClient); spec != "" {
		os.Exit(clientForTest(spec))
	}
	if name := os.Getenv(envXRCClient); name != "" {
		os.Exit(xrcClientForTest(name))
	}
	if name := os.Getenv(envHandOff); name != "" {
		os.Exit(handOffForTest(name))
	}
	if os.Getenv(envHolder) != "" {
		os.Exit(holderForTest())
	}
	if names := os.Getenv(envStreamer); names != "" {
		os.Exit(streamerForTest(names))
	}
	os.Exit(m.Run())
}

// attach opens a context on a device process; at the end of the test,
// once the device has freed everything, it checks that the device saw no
// transport timeout on its lossless link since the context was opened
// (unless the test is about them, or the machine stalled: lossless).
// Timeouts before do not count: a test that kills a client mid-stream may
// leave its peer QP's timer to fire.
func attach(t testing.TB, s *hcatest.Service) *verbs.Context {
	t.Helper()
	before := transportTimeouts(t, s)
	// A peer's late answers time out this device's requests: every device
	// process of the test directory counts.
	w := watchLossless(t, func() map[string]uint64 { return dirLateRounds(t, s.Dir) })
	t.Cleanup(func() {
		if n := transportTimeouts(t, s) - before; n > 0 && !isBenchmark(t) && !strings.Contains(t.Name(), "RetryExceeded") && !strings.Contains(t.Name(), "ResetAndReconnect") {
			if why := w.excuse(t); why != "" {
				t.Logf("%s: transport timer fired %d times; meanwhile %s", s.Name, n, why)
				return
			}
			t.Errorf("%s: transport timer fired %d times on a lossless link", s.Name, n)
		}
	})
	return s.Attach(t)
}

// transportTimeouts is the device's transport timeouts that were not late
// (Device.timeout): on a lossless link, none should fire.
func transportTimeouts(t testing.TB, s *hcatest.Service) int64 {
	t.Helper()
	m := s.Counters(t)
	return int64(m["ack_timeouts"]) - int64(m["late_timeouts"])
}

func clientForTest(name string) int {
	c, err := verbs.Open(context.Background(), name, verbs.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	must := func(err error) {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	pd, err := c.AllocPD()
	must(err)
	buf, err := verbs.Alloc(1 << 16)
	must(err)
	_, err = pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	must(err)
	cq, err := c.CreateCQ(64, nil, 0)
	must(err)
	srq, err := pd.CreateSRQ(verbs.SRQAttr{MaxWR: 16, MaxSGE: 1})
	must(err)
	for range 3 {
		_, err := pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: cq, RecvCQ: cq, SRQ: srq,
			Cap: verbs.QPCap{MaxSendWR: 16, MaxSendSGE: 1}})
		must(err)
	}
	fmt.Println("ready")
	select {} // until killed
}

// TestConformanceOutOfProcess runs the verbs suite against device
// processes: both contexts on one device, and one on each of two devices
// that talk RoCEv2 over UDP.
func TestConformanceOutOfProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two device processes per test")
	}
	dir := t.TempDir()
	t.Run("OneDevice", func(t *testing.T) {
		verbstest.Run(t, verbstest.Env{Name: "device process", Open: func(t testing.TB) (a, b *verbs.Context) {
			s := hcatest.Start(t, dir)
			return attach(t, s), attach(t, s)
		}})
	})
	t.Run("TwoDevices", func(t *testing.T) {
		verbstest.Run(t, verbstest.Env{Name: "two device processes", Open: func(t testing.TB) (a, b *verbs.Context) {
			// Both devices start before either is attached, so that both
			// are still up when attach's checks run (cleanups run last
			// first): a device's timeouts may be excused by its peer's
			// late rounds.
			sa, sb := hcatest.Start(t, dir), hcatest.Start(t, dir)
			return attach(t, sa), attach(t, sb)
		}})
	})
}

// TestClientKilled kills a client process that holds objects of every
// kind: the device destroys them all, and another client keeps working.
func TestClientKilled(t *testing.T) {
	dir := t.TempDir()
	s := hcatest.Start(t, dir)
	env := verbstest.Env{Name: "survivor", Open: func(t testing.TB) (a, b *verbs.Context) { return attach(t, s), attach(t, s) }}
	pa, pb := verbstest.Connect(t, env, 4096)
	before := s.Counters(t)

	cmd, out := startClient(t, envClient+"="+s.Name, softhca.RuntimeDirEnv+"="+dir)
	line := make([]byte, 6)
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("client: %q, %v", line, err)
	}
	during := s.Counters(t)
	if during["objects_clients"] != before["objects_clients"]+1 || during["objects_qps"] != before["objects_qps"]+3 ||
		during["objects_srqs"] != before["objects_srqs"]+1 || during["objects_mrs"] != before["objects_mrs"]+1 {
		t.Fatalf("with the client: %v; before: %v", during, before)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		after := s.Counters(t)
		same := true
		for _, k := range []string{"objects_clients", "objects_pds", "objects_mrs", "objects_cqs", "objects_srqs", "objects_qps"} {
			same = same && after[k] == before[k]
		}
		if same {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after SIGKILL: %v; before the client: %v", after, before)
		}
	}
	stillTalk(t, pa, pb)
}

// startClient runs the test binary as a client process with the extra
// environment env (its role, for TestMain) and returns it with its
// standard output.
func startClient(t *testing.T, env ...string) (*exec.Cmd, io.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// stillTalk checks that a connected pair still works after another client
// died: a SEND from a arrives at b.
func stillTalk(t *testing.T, a, b verbstest.Endpoint) {
	t.Helper()
	if err := b.QP.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{b.MR.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	copy(a.Buf, "still here")
	if err := a.QP.PostSend(&verbs.SendWR{WRID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{a.MR.SGE(0, 10)}}); err != nil {
		t.Fatal(err)
	}
	waitWC(t, a.CQ, 2)
	waitWC(t, b.CQ, 1)
	if string(b.Buf[:10]) != "still here" {
		t.Fatalf("received %q", b.Buf[:10])
	}
}

// waitWC waits for a successful completion of wrid.
func waitWC(t *testing.T, cq *verbs.CQ, wrid uint64) {
	t.Helper()
	wc := make([]verbs.WorkCompletion, 1)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Microsecond) {
		n, err := cq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			if wc[0].Status != verbs.WCSuccess || wc[0].WRID != wrid {
				t.Fatalf("completion %+v, want wr %d", wc[0], wrid)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no completion of wr %d", wrid)
		}
	}
}

// TestQueuesShareMappings: a client's queues share the memory the device
// maps for them, so that a client with many QPs costs the device a few
// mappings (each one of its vm.max_map_count), not one a queue; and the
// device unmaps that memory when the client destroys its queues.
func TestQueuesShareMappings(t *testing.T) {
	const n = 300
	dir := t.TempDir()
	s := hcatest.Start(t, dir)
	c := attach(t, s)
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	cq, err := c.CreateCQ(4*n, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	before := s.Counters(t)["client_mappings"]
	qps := make([]*verbs.QP, n)
	for i := range qps {
		if qps[i], err = pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: cq, RecvCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	during := s.Counters(t)
	if during["objects_qps"] != n {
		t.Fatalf("%d QPs on the device, want %d", during["objects_qps"], n)
	}
	if m := during["client_mappings"] - before; m > 8 {
		t.Errorf("%d QPs: the device maps %d more pieces of the client's memory, want a few", n, m)
	}
	for _, q := range qps {
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if m := s.Counters(t)["client_mappings"]; m > before+1 {
		t.Errorf("after destroying the QPs: the device maps %d pieces of the client's memory, %d before them", m, before)
	}
}

// BenchmarkCreateQPOutOfProcess measures the creation of an RC QP on a
// device in another process (its queue memory included), b.N QPs alive
// at once.
func BenchmarkCreateQPOutOfProcess(b *testing.B) {
	s := hcatest.Start(b, b.TempDir())
	c := attach(b, s)
	pd, err := c.AllocPD()
	if err != nil {
		b.Fatal(err)
	}
	defer pd.Close()
	cq, err := c.CreateCQ(64, nil, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer cq.Close()
	qps := make([]*verbs.QP, 0, b.N)
	defer func() {
		for _, q := range qps {
			q.Close()
		}
	}()
	for b.Loop() {
		q, err := pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: cq, RecvCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			b.Fatal(err)
		}
		qps = append(qps, q)
	}
}
