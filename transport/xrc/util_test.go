package xrc

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/bootstrap/boottest"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/transport/internal/transporttest"
	"github.com/xrcrun/xrc/verbs"
)

// newDevice starts an in-process soft HCA: on fab, or, with fab nil,
// speaking RoCEv2 on UDP on a loopback address of its own. When the test
// ends it checks that the device sent no RNR NAK.
func newDevice(t testing.TB, fab *softhca.Fabric, faults softhca.Faults) *softhca.Device {
	t.Helper()
	d := transporttest.Device(t, "xrct", softhca.Config{Faults: faults, Fabric: fab, UDP: fab == nil})
	t.Cleanup(func() {
		// Credits keep every sender within the receivers' buffers.
		if n := d.Counters().RNRNaksSent.Load(); n > 0 {
			t.Errorf("%s: %d RNR NAKs sent", d.Name(), n)
		}
	})
	return d
}

// end is one rank of a test job.
type end = transporttest.End[*Transport]

// testJob is a job of ranks as goroutines: rank r on node nodes[r], each
// node a soft HCA, each rank with a verbs context of its own (as a
// process has) and the node's domain file.
type testJob struct {
	nodes []int
	devs  map[int]*softhca.Device
	ends  []*end
}

// job makes the devices and one transport per rank, and connects them
// through an exchange of their records, after mod changes their configs.
// With udp the nodes speak RoCEv2 on UDP (and faults apply).
func job(t testing.TB, nodes []int, udp bool, faults softhca.Faults, mod func(*Config)) *testJob {
	t.Helper()
	j := &testJob{nodes: nodes, devs: map[int]*softhca.Device{}}
	var fab *softhca.Fabric
	if !udp {
		fab = softhca.NewFabric()
	}
	dir := t.TempDir()
	for _, n := range nodes {
		if j.devs[n] == nil {
			j.devs[n] = newDevice(t, fab, faults)
		}
	}
	j.ends = make([]*end, len(nodes))
	for r, n := range nodes {
		c, err := j.devs[n].Open(verbs.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := c.Close(); err != nil {
				t.Error(err)
			}
		})
		k := transporttest.NewKicker()
		cfg := Config{Device: c, Rank: r, Nodes: nodes, Kick: k.Kick,
			DomainFile: filepath.Join(dir, fmt.Sprintf("xrcd-%d", n))}
		if mod != nil {
			mod(&cfg)
		}
		tr, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		j.ends[r] = transporttest.NewEnd(t, tr, k)
	}
	transporttest.Connect(t, j.ends, nodes)
	return j
}

// clients joins ranks, on the given nodes, to a rendezvous server of
// their own.
func clients(t *testing.T, nodes []int) []*bootstrap.Client { return boottest.Clients(t, nodes) }

var (
	progress = transporttest.Progress[*Transport]
	pattern  = transporttest.Pattern
)
