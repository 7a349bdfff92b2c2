package softhca_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/softhca/hcatest"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// envStreamer makes the test binary a client that streams RDMA WRITEs
// between two devices until it is killed: "nameA,nameB" (in
// XRC_RUNTIME_DIR).
const envStreamer = "XRC_TEST_STREAMER"

// TestClientKilledStreaming kills a client in the middle of a stream of
// 1 MiB RDMA WRITEs from its memory on one device process to its memory on
// another, again and again. The sending device sends the data straight
// from the client's memory, which goes away with the client: neither
// device may fail, both free everything, and other clients carry on.
func TestClientKilledStreaming(t *testing.T) {
	dir := t.TempDir()
	a, b := hcatest.Start(t, dir), hcatest.Start(t, dir)
	// No transport timer may fire while a stream runs; after the kill one
	// may, when the receiving device drops the dead client's QP before the
	// sending one does.
	timeouts := func() int64 { return transportTimeouts(t, a) + transportTimeouts(t, b) }
	settled := timeouts()
	for i := range 50 {
		w := watchLossless(t, func() map[string]uint64 { return dirLateRounds(t, dir) })
		cmd, out := startClient(t, envStreamer+"="+a.Name+","+b.Name, softhca.RuntimeDirEnv+"="+dir)
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "streaming\n" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("streamer %d: %q, %v", i, line, err)
		}
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
		n := timeouts() - settled
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		a.WaitClean(t)
		b.WaitClean(t)
		settled = timeouts() // no QP is left to fire one
		// The evidence is gathered once the devices have read every
		// datagram: one that came late is counted when it is read.
		if n != 0 {
			if why := w.excuse(t); why != "" {
				t.Logf("streamer %d: %d transport timeouts; meanwhile %s", i, n, why)
			} else {
				t.Errorf("streamer %d: %d transport timeouts while it streamed on a lossless link", i, n)
			}
		}
	}
	if m := a.Counters(t); m["port_xmit_packets"] < 1000 {
		t.Fatalf("the streams sent only %d packets", m["port_xmit_packets"])
	}
	// Both devices still serve, and talk to each other.
	env := verbstest.Env{Name: "survivors", Open: func(t testing.TB) (x, y *verbs.Context) { return attach(t, a), attach(t, b) }}
	pa, pb := verbstest.Connect(t, env, 4096)
	stillTalk(t, pa, pb)
}

// procTB lets a client process use verbstest's connection helpers: it has
// no test to fail, so it exits.
type procTB struct{ testing.TB }

func (procTB) Helper() {}
func (procTB) Fatal(args ...any) {
	fmt.Fprintln(os.Stderr, args...)
	os.Exit(1)
}
func (t procTB) Fatalf(format string, args ...any) { t.Fatal(fmt.Sprintf(format, args...)) }

// streamerForTest connects a QP on each of two devices to the other and
// writes 1 MiB at a time from the first to the second, eight writes
// outstanding, until it is killed. It says "streaming" once data flows.
func streamerForTest(names string) int {
	var tb procTB
	name := strings.Split(names, ",")
	type end struct {
		qp  *verbs.QP
		cq  *verbs.CQ
		mr  *verbs.MR
		gid verbs.GID
	}
	var ends [2]end
	for i := range ends {
		c, err := verbs.Open(context.Background(), name[i], verbs.Config{})
		if err != nil {
			tb.Fatal(err)
		}
		pd, err := c.AllocPD()
		if err != nil {
			tb.Fatal(err)
		}
		buf, err := verbs.Alloc(4 << 20)
		if err != nil {
			tb.Fatal(err)
		}
		e := &ends[i]
		if e.mr, err = pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
			tb.Fatal(err)
		}
		if e.cq, err = c.CreateCQ(64, nil, 0); err != nil {
			tb.Fatal(err)
		}
		if e.qp, err = pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: e.cq, RecvCQ: e.cq,
			Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
			tb.Fatal(err)
		}
		port, err := c.QueryPort(1)
		if err != nil {
			tb.Fatal(err)
		}
		e.gid = port.GID
	}
	opt := verbstest.Options{MTU: verbs.MTU4096}
	verbstest.BringUpWith(tb, ends[0].qp, ends[1].gid, ends[1].qp.Num(), opt)
	verbstest.BringUpWith(tb, ends[1].qp, ends[0].gid, ends[0].qp.Num(), opt)
	src, dst := ends[0], ends[1]
	wc := make([]verbs.WorkCompletion, 16)
	for posted, done := 0, 0; ; {
		for ; posted-done < 8; posted++ {
			off := posted % 4 << 20
			wr := &verbs.SendWR{Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
				SG: []verbs.SGE{src.mr.SGE(off, 1<<20)}, RemoteAddr: dst.mr.Addr() + uint64(off), RKey: dst.mr.RKey()}
			if err := src.qp.PostSend(wr); err != nil {
				tb.Fatal(err)
			}
		}
		n, err := src.cq.Poll(wc)
		if err != nil {
			tb.Fatal(err)
		}
		for _, c := range wc[:n] {
			if c.Status != verbs.WCSuccess {
				tb.Fatalf("completion %+v", c)
			}
		}
		if done < 4 && done+n >= 4 {
			fmt.Println("streaming")
		}
		done += n
	}
}
