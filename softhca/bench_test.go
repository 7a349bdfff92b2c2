package softhca_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/softhca/hcatest"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// benchEnvs are the in-process setups the benchmarks run on.
var benchEnvs = []verbstest.Env{
	{Name: "loopback", Open: func(t testing.TB) (a, b *verbs.Context) {
		d := newDevice(t, nil)
		return open(t, d), open(t, d)
	}},
	{Name: "two-devices", Open: func(t testing.TB) (a, b *verbs.Context) {
		f := softhca.NewFabric()
		return open(t, newDevice(t, f)), open(t, newDevice(t, f))
	}},
	{Name: "two-devices-udp", Open: func(t testing.TB) (a, b *verbs.Context) {
		return open(t, newUDPDevice(t, softhca.Config{})), open(t, newUDPDevice(t, softhca.Config{}))
	}},
	// Two devices that reach their clients' memory with
	// process_vm_readv/writev, as they reach Go memory in other processes.
	{Name: "two-devices-udp-processmem", Open: func(t testing.TB) (a, b *verbs.Context) {
		da, db := newUDPDevice(t, softhca.Config{}), newUDPDevice(t, softhca.Config{})
		da.ReachMemoryThroughProcess()
		db.ReachMemoryThroughProcess()
		return open(t, da), open(t, db)
	}},
	{Name: "two-devices-udp-nospin", Open: func(t testing.TB) (a, b *verbs.Context) {
		return open(t, newUDPDevice(t, softhca.Config{SpinIdle: -1})), open(t, newUDPDevice(t, softhca.Config{SpinIdle: -1}))
	}},
	{Name: "device-process", Open: func(t testing.TB) (a, b *verbs.Context) {
		s := hcatest.Start(t, t.TempDir())
		return attach(t, s), attach(t, s)
	}},
	{Name: "two-device-processes", Open: func(t testing.TB) (a, b *verbs.Context) {
		dir := t.TempDir()
		sa, sb := hcatest.Start(t, dir), hcatest.Start(t, dir) // both up for attach's checks
		return attach(t, sa), attach(t, sb)
	}},
}

// spin polls cq until it returns one completion.
func spin(b *testing.B, cq *verbs.CQ, wc []verbs.WorkCompletion) {
	for {
		n, err := cq.Poll(wc[:1])
		if err != nil {
			b.Fatal(err)
		}
		if n == 1 {
			if wc[0].Status != verbs.WCSuccess {
				b.Fatalf("completion %+v", wc[0])
			}
			return
		}
	}
}

// BenchmarkSendLatency measures post-to-completion time of an 8-byte
// signaled SEND: from PostSend until the sender polls its completion, which
// needs the responder's acknowledgement. It reports the median and the
// 99th percentile.
func BenchmarkSendLatency(b *testing.B) {
	for _, env := range benchEnvs {
		b.Run(env.Name, func(b *testing.B) {
			pa, pb := verbstest.Connect(b, env, 4096)
			wc := make([]verbs.WorkCompletion, 1)
			recv := &verbs.RecvWR{SG: []verbs.SGE{pb.MR.SGE(0, 64)}}
			send := &verbs.SendWR{Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SG: []verbs.SGE{pa.MR.SGE(0, 8)}}
			var lat []time.Duration
			for b.Loop() {
				if err := pb.QP.PostRecv(recv); err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				if err := pa.QP.PostSend(send); err != nil {
					b.Fatal(err)
				}
				spin(b, pa.CQ, wc)
				lat = append(lat, time.Since(t0))
				spin(b, pb.CQ, wc)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}

// BenchmarkWriteThroughput streams signaled RDMA WRITEs of one size with up
// to 16 outstanding, at path MTU 4096, and reports bytes per second. The
// sender either polls its CQ (as ib_write_bw does) or, in the "events"
// runs, sleeps on its completion channel, which leaves the CPUs to the
// device processes: on a 2-core machine a polling sender takes one of them.
func BenchmarkWriteThroughput(b *testing.B) {
	for _, env := range benchEnvs {
		for _, size := range []int{64 << 10, 1 << 20} {
			name := env.Name + "/" + map[int]string{64 << 10: "64KiB", 1 << 20: "1MiB"}[size]
			b.Run(name, func(b *testing.B) { writeStream(b, env, size, false) })
			if strings.Contains(env.Name, "process") {
				b.Run(name+"/events", func(b *testing.B) { writeStream(b, env, size, true) })
			}
		}
	}
}

func writeStream(b *testing.B, env verbstest.Env, size int, events bool) {
	pa, pb := verbstest.ConnectWith(b, env, size, verbstest.Options{MTU: verbs.MTU4096, Channel: events})
	wc := make([]verbs.WorkCompletion, 16)
	wr := &verbs.SendWR{Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{pa.MR.SGE(0, size)}, RemoteAddr: pb.MR.Addr(), RKey: pb.MR.RKey()}
	b.SetBytes(int64(size))
	outstanding := 0
	reap := func() {
		n, err := pa.CQ.Poll(wc)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range wc[:n] {
			if c.Status != verbs.WCSuccess {
				b.Fatalf("completion %+v", c)
			}
		}
		outstanding -= n
		if n == 0 && events {
			// Arm, look once more (a completion may have come before
			// the arm), then sleep until the CQ has one.
			if err := pa.CQ.RequestNotify(false); err != nil {
				b.Fatal(err)
			}
			if n, _ = pa.CQ.Poll(wc); n > 0 {
				outstanding -= n
				return
			}
			if _, err := pa.CQ.Channel().GetEvent(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	}
	for b.Loop() {
		for outstanding >= 16 {
			reap()
		}
		if err := pa.QP.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		outstanding++
	}
	for outstanding > 0 {
		reap()
	}
}
