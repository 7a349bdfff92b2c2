package xrcnodes

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/internal/proctest"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/softhca/hcatest"
)

// The job: senders on node A (ranks 0-3), receivers on node B (ranks
// 4-7), and the test itself as the controller (rank 8, a node of its own).
const (
	senders    = 4
	receivers  = 4
	controller = senders + receivers
	size       = controller + 1
	nodeA      = 0
	nodeB      = 1
	timeout    = 3 * time.Minute
	round2Key  = "round2"

	envRole   = "XRC_XRCNODES_RANK" // set in a worker's environment
	envDomain = "XRC_XRCNODES_DOMAIN"
)

func TestMain(m *testing.M) {
	hcatest.Main()
	if os.Getenv(envRole) != "" {
		os.Exit(rankMain())
	}
	os.Exit(m.Run())
}

// TestTwoNodes runs four senders on node A and four receivers on node B,
// each a process of its own. Each sender has exactly one XRC send QP
// toward B and reaches the SRQs of all four receivers through it; on B
// there are exactly four receive QPs, one per sender, each made by the
// receiver that claimed it first and opened by the other three; each node
// has one XRC domain. The devices' object counts prove it. Then the
// receiver that made the most receive QPs exits: they live on, held by
// the others, and still deliver a second round of messages to the three
// receivers left. At the end both devices hold nothing.
func TestTwoNodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	dir := t.TempDir()
	a, b := hcatest.Start(t, dir), hcatest.Start(t, dir)
	key := make([]byte, 32)
	rand.Read(key)
	srv, err := bootstrap.Listen(ctx, "127.0.0.1:0", bootstrap.ServerConfig{Size: size, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go srv.Serve(ctx)

	domainA, domainB := filepath.Join(dir, "node-a.xrcd"), filepath.Join(dir, "node-b.xrcd")
	for _, f := range []string{domainA, domainB} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	procs := make([]*proc, controller)
	for rk := range controller {
		e := bootstrap.Env{Rank: rk, Size: size, LocalRank: rk % senders, LocalSize: senders, Node: rk / senders,
			Nodes: 3, Addr: srv.Addr(), Key: key, JobID: t.Name(), Transport: "xrc", Connect: "eager", Device: a.Name}
		domain := domainA
		if e.Node == nodeB {
			e.Device, domain = b.Name, domainB
		}
		procs[rk] = startRank(t, rk, append(e.Environ(), envRole+"=1", envDomain+"="+domain, softhca.RuntimeDirEnv+"="+dir))
	}
	c, err := bootstrap.Join(ctx, srv.Addr(), key, bootstrap.Member{Rank: controller, Node: 2}, size, bootstrap.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fail := func(format string, args ...any) {
		t.Helper()
		c.Abort(ctx, "the test failed")
		t.Fatalf(format, args...)
	}

	if _, err := c.AllGather(ctx, record{}.bytes()); err != nil {
		fail("%v", err)
	}
	reports, err := c.AllGather(ctx, nil) // after the first round
	if err != nil {
		fail("%v", err)
	}
	created, qpns := make([]int, receivers), []uint32(nil)
	for j := range receivers {
		rep := reports[senders+j]
		if len(rep) != 4+4*senders {
			fail("receiver %d's report of %d bytes", j, len(rep))
		}
		created[j] = int(binary.BigEndian.Uint32(rep))
		var q []uint32
		for i := range senders {
			q = append(q, binary.BigEndian.Uint32(rep[4+4*i:]))
		}
		if j > 0 && !slices.Equal(q, qpns) {
			fail("receivers disagree on the receive QPs: %x and %x", qpns, q)
		}
		qpns = q
	}
	sorted := slices.Sorted(slices.Values(qpns))
	if total := created[0] + created[1] + created[2] + created[3]; total != senders || len(slices.Compact(sorted)) != senders {
		fail("receivers created %v receive QPs, numbered %x: want one per sender", created, qpns)
	}
	t.Logf("receive QPs %x, created by the receivers %v", qpns, created)
	if !counts(t, a, map[string]uint64{"objects_clients": senders, "objects_qps": senders, "objects_srqs": 0, "objects_xrcds": 1}) ||
		!counts(t, b, map[string]uint64{"objects_clients": receivers, "objects_qps": senders, "objects_srqs": receivers, "objects_xrcds": 1}) {
		fail("object counts")
	}

	leaver := senders + slices.Index(created, slices.Max(created))
	if _, err := c.AllGather(ctx, []byte{byte(leaver)}); err != nil {
		fail("%v", err)
	}
	procs[leaver].wait(t)
	// The leaver's receive QPs stay, held by the others: wait for the device
	// to see the client go, then check nothing else went with it.
	want := map[string]uint64{"objects_clients": receivers - 1, "objects_qps": senders, "objects_srqs": receivers - 1, "objects_xrcds": 1}
	for deadline := time.Now().Add(time.Minute); b.Counters(t)["objects_clients"] != receivers-1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			fail("the device still serves the receiver that left")
		}
	}
	if !counts(t, b, want) {
		fail("object counts after receiver %d left with %d receive QPs made", leaver-senders, created[leaver-senders])
	}
	if err := c.Put(ctx, round2Key, []byte{1}); err != nil {
		fail("%v", err)
	}
	for _, p := range procs {
		p.wait(t)
	}
	for _, s := range []*hcatest.Service{a, b} {
		if m := s.WaitIdle(t); m["xrc_srq_errors"] != 0 {
			t.Errorf("%s at the end: %v", s.Name, m)
		}
	}
}

// counts reports whether the device's counters hold want, logging those
// that differ.
func counts(t *testing.T, s *hcatest.Service, want map[string]uint64) bool {
	t.Helper()
	got, ok := s.Counters(t), true
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s = %d, want %d", s.Name, k, got[k], v)
			ok = false
		}
	}
	return ok
}

// proc is a worker process.
type proc struct {
	*proctest.Proc
	rank int
}

// startRank starts rank's worker with env added to this process's
// environment; it is killed, if still running, when the test ends.
func startRank(t *testing.T, rank int, env []string) *proc {
	return &proc{Proc: proctest.Start(t, env, nil), rank: rank}
}

// wait waits for the worker to exit successfully.
func (p *proc) wait(t *testing.T) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(timeout):
		t.Fatalf("rank %d does not end", p.rank)
	}
	if !p.Cmd.ProcessState.Success() {
		t.Fatalf("rank %d: %v", p.rank, p.Cmd.ProcessState)
	}
}
