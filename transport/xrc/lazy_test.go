package xrc

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/transport/internal/transporttest"
)

// TestLazy: with lazy connection no QP exists before the first frame. A
// frame from rank 0 to rank 1 makes rank 0's INI QP toward node 1, and
// rank 1 creates the TGT QP for it; rank 1 answers, making its own INI QP
// and a TGT QP on node 0. Rank 0 then reaches rank 3 over the same INI QP:
// rank 3 opens the TGT QP rank 1 created. A read needs only the INI QP.
func TestLazy(t *testing.T) {
	cs := clients(t, twoByTwo)
	j := job(t, twoByTwo, false, softhca.Faults{}, func(c *Config) { c.Lazy, c.Bootstrap = true, cs[c.Rank] })
	ends := j.ends
	for node, d := range j.devs {
		if o := d.Objects(); o.QPs != 0 || o.XRCDs != 1 || o.SRQs != 2 {
			t.Fatalf("node %d before traffic: %+v", node, o)
		}
	}
	send := func(from, to int, n int) {
		t.Helper()
		transporttest.OneWay(t, ends, from, to, n)
	}
	send(0, 1, 300) // more than the credits: rank 1 returns them over its own INI QP
	type want struct{ ini, created, opened int }
	check := func(stage string, w []want) {
		t.Helper()
		// The answering rank's connection back comes up on its own time.
		progress(t, ends, func() bool {
			for r, e := range ends {
				if st := e.Tr.Stats(); st.Connected != w[r].ini || st.TGTCreated != w[r].created {
					return false
				}
			}
			return true
		})
		for r, e := range ends {
			st := e.Tr.Stats()
			if st.INIQPs != w[r].ini || st.Connected != w[r].ini || st.TGTCreated != w[r].created || st.TGTOpened != w[r].opened {
				t.Errorf("%s: rank %d: %+v, want %+v", stage, r, st, w[r])
			}
		}
	}
	check("0 to 1", []want{{1, 1, 0}, {1, 1, 0}, {0, 0, 0}, {0, 0, 0}})
	send(0, 3, 50)
	// Rank 3 opened the TGT QP of rank 0's INI QP, and answered with an
	// INI QP of its own, whose TGT QP rank 0 created.
	check("0 to 3", []want{{1, 2, 0}, {1, 1, 0}, {0, 0, 0}, {1, 0, 1}})
	if st := ends[0].Tr.Stats(); st.HandshakeTime <= 0 {
		t.Errorf("no handshake time: %+v", st)
	}
	// Rank 2 reads from rank 1 with no frame sent: its INI QP toward
	// node 1 comes up (rank 1 claims and creates its TGT QP).
	src := pattern(9, 3<<20)
	rm, err := ends[1].Tr.Expose(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(src))
	if err := ends[2].Tr.Read(1, dst, rm, 1); err != nil {
		t.Fatal(err)
	}
	progress(t, ends, func() bool { _, ok := ends[2].H.Reads[1]; return ok })
	if err := ends[2].H.Reads[1]; err != nil || !bytes.Equal(dst, src) {
		t.Fatalf("read: %v", err)
	}
	// Node 1 holds the INI QPs of ranks 1 and 3 and the TGT QPs of
	// ranks 0 and 2; node 0 the INI QPs of ranks 0 and 2 and the TGT QPs
	// of ranks 1 and 3.
	for node, want := range map[int]int{0: 2 + 2, 1: 2 + 2} {
		if o := j.devs[node].Objects(); o.QPs != want {
			t.Errorf("node %d: %d QPs, want %d", node, o.QPs, want)
		}
	}
	for _, e := range ends {
		e.H = transporttest.NewHandler()
	}
	allToAll(t, ends, 20) // everyone else connects on demand
	for node, d := range j.devs {
		if o := d.Objects(); o.QPs != 4 || o.XRCDs != 1 || o.SRQs != 2 {
			t.Errorf("node %d after all-to-all: %+v, want what eager connection makes", node, o)
		}
	}
}

// TestLazySecondRequest: a second connection request from a rank (here
// with another PSN, as a confused or malicious peer sends) is refused and
// counted, whenever it comes. Two requests that came together used to
// claim and create a TGT QP each: the first leaked, and publishing the
// second failed the node's INI QP.
func TestLazySecondRequest(t *testing.T) {
	cs := clients(t, twoByTwo)
	j := job(t, twoByTwo, false, softhca.Faults{}, func(c *Config) { c.Lazy, c.Bootstrap = true, cs[c.Rank] })
	ends := j.ends
	sent, err := ends[0].Tr.TrySend(1, []byte("x")) // asks for the connection
	if err != nil {
		t.Fatal(err)
	}
	// Rank 1 takes both requests in one Progress: the second one after
	// the first one.
	queued := func(n int) {
		l := ends[1].Tr.lz
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
			l.mu.Lock()
			k := len(l.acts)
			l.mu.Unlock()
			if k >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d messages in rank 1's mailbox", k, n)
			}
		}
	}
	queued(1)
	ini := ends[0].Tr.nodes[0].ini
	dup := message{kind: msgRequest, rank: 0, qpn: ini.QP.Num(), psn: (ini.PSN + 1) & (1<<24 - 1)}
	if err := ends[0].Tr.lz.mbox.Put(t.Context(), 1, dup.encode()); err != nil {
		t.Fatal(err)
	}
	queued(2)
	progress(t, ends, func() bool {
		if !sent {
			if sent, err = ends[0].Tr.TrySend(1, []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		return len(ends[1].H.Frames[0]) == 1 && counterValue(ends[1].Tr.m.Bad) == 1
	})
	if err := ends[1].Tr.nodes[0].ini.Err(); err != nil {
		t.Fatalf("rank 1's INI QP toward node 0 failed: %v", err)
	}
	for _, e := range ends {
		if err := e.Tr.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for n, d := range j.devs {
		if o := d.Objects(); o.QPs != 0 {
			t.Errorf("node %d after every rank closed its transport: %d QPs left", n, o.QPs)
		}
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// TestLazyRefusal: when the rank of a node that claimed a TGT QP cannot
// create it, the requesting rank's INI QP toward that node fails, and so
// do the node's other ranks it asked, which waited for the QP's number
// until Close (and the requester for their replies).
func TestLazyRefusal(t *testing.T) {
	cs := clients(t, twoByTwo)
	j := job(t, twoByTwo, false, softhca.Faults{}, func(c *Config) { c.Lazy, c.Bootstrap = true, cs[c.Rank] })
	ends := j.ends
	for _, r := range []int{1, 3} {
		ends[r].Tr.failTGT = errors.New("no TGT QP today")
	}
	refused := map[int]error{}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Millisecond) {
		for _, to := range []int{1, 3} {
			if refused[to] == nil {
				if _, err := ends[0].Tr.TrySend(to, []byte("x")); err != nil {
					refused[to] = err
				}
			}
		}
		for _, e := range ends {
			e.Tr.Progress(e.H)
		}
		if refused[1] != nil && refused[3] != nil && ends[1].Tr.nodes[0].ini.Err() != nil && ends[3].Tr.nodes[0].ini.Err() != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sends from rank 0: %v; ranks 1 and 3 toward node 0: %v, %v", refused,
				ends[1].Tr.nodes[0].ini.Err(), ends[3].Tr.nodes[0].ini.Err())
		}
	}
	for to, err := range refused {
		if !strings.Contains(err.Error(), "could not create or open the TGT QP") {
			t.Errorf("send to rank %d: %v", to, err)
		}
	}
	for _, r := range []int{1, 3} {
		t.Logf("rank %d: %v", r, ends[r].Tr.nodes[0].ini.Err())
	}
}

// TestLazyRequestAfterFailure: once a rank's INI QP toward a node has
// failed (here: it could not create the TGT QP of one rank of that node),
// a request from another rank of that node is refused, not dropped: the
// asking rank used to wait for a reply that never came.
func TestLazyRequestAfterFailure(t *testing.T) {
	cs := clients(t, twoByTwo)
	j := job(t, twoByTwo, false, softhca.Faults{}, func(c *Config) { c.Lazy, c.Bootstrap = true, cs[c.Rank] })
	ends := j.ends
	ends[1].Tr.failTGT = errors.New("no TGT QP today")
	var err0, err2 error
	for deadline := time.Now().Add(time.Minute); err0 == nil; time.Sleep(time.Millisecond) {
		_, err0 = ends[0].Tr.TrySend(1, []byte("x"))
		for _, e := range ends {
			e.Tr.Progress(e.H)
		}
		if time.Now().After(deadline) {
			t.Fatal("rank 0's request to rank 1 was never refused")
		}
	}
	if ends[1].Tr.nodes[0].ini.Err() == nil {
		t.Fatal("rank 1's INI QP toward node 0 did not fail")
	}
	for deadline := time.Now().Add(30 * time.Second); err2 == nil; time.Sleep(time.Millisecond) {
		_, err2 = ends[2].Tr.TrySend(1, []byte("x"))
		for _, e := range ends {
			e.Tr.Progress(e.H)
		}
		if time.Now().After(deadline) {
			t.Fatal("rank 2's request to rank 1, whose INI QP toward node 0 failed, got no answer")
		}
	}
	if !strings.Contains(err2.Error(), "could not create or open the TGT QP") {
		t.Errorf("send from rank 2 to rank 1: %v", err2)
	}
}

// TestLazyMalformedTGTNumber: a TGT QP number published under a node's
// key that does not decode fails the connection and is counted as
// malformed input, as a malformed mailbox message is.
func TestLazyMalformedTGTNumber(t *testing.T) {
	cs := clients(t, twoByTwo)
	j := job(t, twoByTwo, false, softhca.Faults{}, func(c *Config) { c.Lazy, c.Bootstrap = true, cs[c.Rank] })
	ends := j.ends
	// Rank 3 of node 1 claims the TGT QP of rank 0's INI QP, and
	// publishes a number of 3 bytes.
	if err := cs[3].Put(t.Context(), claimKey(1, 0), []byte{3, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	if err := cs[3].Put(t.Context(), tgtKey(1, 0), []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := ends[0].Tr.TrySend(1, []byte("x")); err != nil {
		t.Fatal(err)
	}
	progress(t, ends, func() bool { return ends[1].Tr.nodes[0].ini.Err() != nil })
	if err := ends[1].Tr.nodes[0].ini.Err(); !errors.Is(err, errRecord) {
		t.Errorf("rank 1's INI QP toward node 0: %v", err)
	}
	if n := counterValue(ends[1].Tr.m.Bad); n != 1 {
		t.Errorf("rank 1 counted %v malformed inputs, want 1", n)
	}
}
