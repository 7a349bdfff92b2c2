package xrc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc64"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/transport/internal/transporttest"
	"github.com/xrcrun/xrc/verbs"
)

// twoByTwo places ranks 0 and 2 on node 0, 1 and 3 on node 1.
var twoByTwo = []int{0, 1, 0, 1}

// TestEagerObjects: with two nodes of two ranks connected at Connect,
// each node's device holds one XRC domain, two XRC SRQs (one per rank),
// two INI QPs (one per rank, toward the other node) and two TGT QPs (one
// per remote rank's INI QP), each created by one rank and opened by the
// other.
func TestEagerObjects(t *testing.T) {
	j := job(t, twoByTwo, false, softhca.Faults{}, nil)
	for node, d := range j.devs {
		o := d.Objects()
		if o.XRCDs != 1 || o.SRQs != 2 || o.QPs != 4 {
			t.Errorf("node %d: %+v, want 1 XRC domain, 2 SRQs, 4 QPs (2 INI, 2 TGT)", node, o)
		}
	}
	for r, e := range j.ends {
		st := e.Tr.Stats()
		if st.INIQPs != 1 || st.Connected != 1 || st.TGTCreated != 1 || st.TGTOpened != 1 || st.SRQs != 1 ||
			st.QueueBytes <= 0 || st.RegisteredBytes <= 0 || st.SetupTime <= 0 {
			t.Errorf("rank %d: %+v", r, st)
		}
	}
	allToAll(t, j.ends, 20)
}

// allToAll sends n frames from every rank to every rank of the other
// nodes, of sizes from 0 bytes to the eager size, keeping as many in
// flight as the transports take, and checks that they arrive intact and
// in order.
func allToAll(t *testing.T, ends []*end, n int) {
	t.Helper()
	type pair struct{ from, to int }
	sent := map[pair]int{}
	largest := ends[0].Tr.MaxEager()
	frame := func(p pair, i int) [][]byte { return transporttest.Frame(p.from*100000+p.to*1000, i, largest) }
	var pairs []pair
	for from, e := range ends {
		for to := range ends {
			if e.Tr.Reaches(to) {
				pairs = append(pairs, pair{from, to})
			}
		}
	}
	progress(t, ends, func() bool {
		done := true
		for _, p := range pairs {
			for sent[p] < n {
				ok, err := ends[p.from].Tr.TrySend(p.to, frame(p, sent[p])...)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				sent[p]++
			}
			done = done && len(ends[p.to].H.Frames[p.from]) == n
		}
		return done
	})
	for _, p := range pairs {
		for i, f := range ends[p.to].H.Frames[p.from] {
			want := frame(p, i)
			if !bytes.Equal(f, append(want[0], want[1]...)) {
				t.Fatalf("frame %d from %d to %d: %d bytes, differs (want %d)", i, p.from, p.to, len(f), transporttest.FrameSize(i, largest))
			}
		}
	}
}

// TestSharedSendQueue: few credits and the smallest send queue, shared by
// the frames to both ranks of the other node and by credit messages:
// thousands of frames arrive in order, and nothing is RNR NAKed.
func TestSharedSendQueue(t *testing.T) {
	j := job(t, twoByTwo, false, softhca.Faults{}, func(c *Config) { c.SRQDepth, c.SendDepth, c.SendSlots = 24, 8, 4 })
	allToAll(t, j.ends, 1500)
}

// TestReads: every rank reads buffers every rank of the other node
// exposed, through its one INI QP toward that node, each READ naming the
// SRQ (and so the PD) of the rank that exposed the memory; reads of 1 byte
// to several chunks, all at once.
func TestReads(t *testing.T) {
	j := job(t, twoByTwo, false, softhca.Faults{}, nil)
	ends := j.ends
	srcs := make([][]byte, len(ends))
	rms := make([]transport.Remote, len(ends))
	for r, e := range ends {
		srcs[r] = pattern(r+1, 3<<20+17)
		var err error
		if rms[r], err = e.Tr.Expose(srcs[r]); err != nil {
			t.Fatal(err)
		}
	}
	type rd struct {
		reader, from int
		dst          []byte
	}
	reads := map[uint64]rd{}
	var cookie uint64
	for r, e := range ends {
		for from := range ends {
			if !e.Tr.Reaches(from) {
				continue
			}
			for _, n := range []int{1, 4097, 1 << 20, 3<<20 + 17} {
				cookie++
				dst := make([]byte, n)
				reads[cookie] = rd{r, from, dst}
				if err := e.Tr.Read(from, dst, rms[from], cookie); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	progress(t, ends, func() bool {
		k := 0
		for _, e := range ends {
			k += len(e.H.Reads)
		}
		return k == len(reads)
	})
	for c, x := range reads {
		if err, ok := ends[x.reader].H.Reads[c]; !ok || err != nil {
			t.Fatalf("read %d by %d from %d: %v, %v", c, x.reader, x.from, ok, err)
		}
		if !bytes.Equal(x.dst, srcs[x.from][:len(x.dst)]) {
			t.Fatalf("read of %d bytes by %d from %d differs", len(x.dst), x.reader, x.from)
		}
	}
	for r, e := range ends {
		if err := e.Tr.Unexpose(rms[r]); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBadInput: remotes of another transport or rank, frames too large,
// ranks of this node, and unexposing twice are refused with clear errors.
func TestBadInput(t *testing.T) {
	j := job(t, twoByTwo, false, softhca.Faults{}, nil)
	tr := j.ends[0].Tr
	buf := make([]byte, 100)
	good, err := j.ends[1].Tr.Expose(buf)
	if err != nil {
		t.Fatal(err)
	}
	rcLike := append(transport.Remote(nil), good...)
	rcLike[0] = 'R'
	for name, src := range map[string]transport.Remote{"rc's": rcLike, "short": good[:10], "empty": nil} {
		if err := tr.Read(1, buf[:10], src, 1); !errors.Is(err, transport.ErrBadRemote) {
			t.Errorf("%s remote: %v", name, err)
		}
	}
	if err := tr.Read(3, buf[:10], good, 1); !errors.Is(err, transport.ErrBadRemote) {
		t.Errorf("rank 1's remote read from rank 3: %v", err)
	}
	if err := tr.Read(1, make([]byte, 101), good, 1); !errors.Is(err, transport.ErrBadRemote) {
		t.Errorf("read past the remote: %v", err)
	}
	if err := tr.Unexpose(good); !errors.Is(err, transport.ErrBadRemote) {
		t.Errorf("unexpose another rank's remote: %v", err)
	}
	if ok, err := tr.TrySend(1, make([]byte, tr.MaxEager()+1)); ok || err == nil {
		t.Errorf("oversized frame: %v, %v", ok, err)
	}
	if _, err := tr.TrySend(2, []byte("x")); !errors.Is(err, transport.ErrUnreachable) {
		t.Errorf("send to a rank of this node: %v", err)
	}
	if err := j.ends[1].Tr.Unexpose(good); err != nil {
		t.Fatal(err)
	}
	if err := j.ends[1].Tr.Unexpose(good); !errors.Is(err, transport.ErrBadRemote) {
		t.Errorf("unexpose twice: %v", err)
	}
}

// TestRecords: malformed or inconsistent records are refused by Connect
// with errors that say what is wrong.
func TestRecords(t *testing.T) {
	fab := softhca.NewFabric()
	d := newDevice(t, fab, softhca.Faults{})
	c, err := d.Open(verbs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tr, err := New(Config{Device: c, Rank: 0, Nodes: []int{0, 1}, Kick: func() {}, DomainFile: t.TempDir() + "/d"})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	good := tr.Record()
	r, _ := parseRecord(good, 2)
	noINI := *r
	noINI.inis = nil
	badSRQ := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(badSRQ[24:], 0)
	for name, tc := range map[string]struct {
		rec  []byte
		want string
	}{
		"empty":   {nil, "0 bytes"},
		"version": {append([]byte{9}, good[1:]...), "version 9"},
		"short":   {good[:len(good)-1], "bytes for"},
		"srqn":    {badSRQ, "SRQ number"},
		"no INI":  {noINI.encode(2), "no INI QP toward node 0"},
	} {
		err := tr.Connect(context.Background(), []transport.Peer{{Rank: 0, Record: good}, {Rank: 1, Node: 1, Record: tc.rec}})
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	if err := tr.Connect(context.Background(), []transport.Peer{{Rank: 0, Record: good}, {Rank: 1, Node: 0, Record: good}}); err == nil {
		t.Error("a peer on the wrong node: connected")
	}
}

// FuzzRecord: parsing never panics, and what parses encodes back the same.
func FuzzRecord(f *testing.F) {
	f.Add((&record{mtu: verbs.MTU1024, srqn: 5, inis: []iniEntry{{1, 0x48, 7}}, tgts: []tgtEntry{{1, 0x800049}}}).encode(2), 2)
	f.Add(message{kind: msgRequest, rank: 1, qpn: 9, psn: 3}.encode(), 2)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > 1000 {
			return
		}
		// The record encodes back the same but for its two reserved
		// bytes (2 and 3): its version and MTU (0 and 1) too.
		if r, err := parseRecord(b, n); err == nil {
			if out := r.encode(n); !bytes.Equal(out[4:], b[4:]) || out[0] != b[0] || out[1] != b[1] {
				t.Fatalf("record round trip of %x: %x", b, out)
			}
		}
		if m, err := parseMessage(b, n); err == nil && !bytes.Equal(m.encode(), b) {
			t.Fatalf("message round trip of %x", b)
		}
	})
}

// TestLossy: two nodes of two ranks whose soft HCAs speak RoCEv2 on UDP
// and lose 5% of their packets: frames, each with its checksum, and reads
// of checksummed buffers all arrive intact and in order.
func TestLossy(t *testing.T) {
	j := job(t, twoByTwo, true, softhca.Faults{Loss: 0.05, Seed: 5}, func(c *Config) { c.SRQDepth = 64 })
	table := crc64.MakeTable(crc64.ECMA)
	sum := func(b []byte) []byte {
		return binary.LittleEndian.AppendUint64(nil, crc64.Checksum(b, table))
	}
	allToAll(t, j.ends, 300)
	for _, e := range j.ends {
		for from, fs := range e.H.Frames {
			for i, f := range fs {
				if len(f) >= 8 && binary.LittleEndian.Uint64(f) != uint64(i) {
					t.Fatalf("frame %d from %d: sequence %d", i, from, binary.LittleEndian.Uint64(f))
				}
			}
		}
	}
	src := pattern(77, 2<<20+5)
	want := sum(src)
	rm, err := j.ends[1].Tr.Expose(src)
	if err != nil {
		t.Fatal(err)
	}
	dsts := [][]byte{make([]byte, len(src)), make([]byte, len(src))}
	for i, r := range []int{0, 2} {
		if err := j.ends[r].Tr.Read(1, dsts[i], rm, uint64(10+i)); err != nil {
			t.Fatal(err)
		}
	}
	progress(t, j.ends, func() bool { return len(j.ends[0].H.Reads) == 1 && len(j.ends[2].H.Reads) == 1 })
	for i, r := range []int{0, 2} {
		if err := j.ends[r].H.Reads[uint64(10+i)]; err != nil || !bytes.Equal(sum(dsts[i]), want) {
			t.Fatalf("rank %d's read: %v, checksum differs: %v", r, err, !bytes.Equal(sum(dsts[i]), want))
		}
	}
	var drops, retx uint64
	for _, d := range j.devs {
		drops += d.Counters().FaultDrops.Load()
		retx += d.Counters().Retransmits.Load()
	}
	t.Logf("%d packets dropped, %d retransmitted", drops, retx)
	if drops == 0 || retx == 0 {
		t.Error("no packet lost or retransmitted")
	}
}

// TestReadNamesSRQ: the remote device checks a READ's rkey against the PD
// of the SRQ it names: a read of rank 1's memory naming rank 3's SRQ (a
// PD of another process) fails, as the transport's reads would if they
// named any SRQ but the exposing rank's.
func TestReadNamesSRQ(t *testing.T) {
	j := job(t, twoByTwo, false, softhca.Faults{}, nil)
	src := pattern(3, 5000)
	rm, err := j.ends[1].Tr.Expose(src)
	if err != nil {
		t.Fatal(err)
	}
	tr := j.ends[0].Tr
	tr.peers[1].SRQN = tr.peers[3].SRQN
	if err := tr.Read(1, make([]byte, len(src)), rm, 1); err != nil {
		t.Fatal(err)
	}
	progress(t, j.ends[:1], func() bool { _, ok := j.ends[0].H.Reads[1]; return ok })
	if err := j.ends[0].H.Reads[1]; err == nil {
		t.Fatal("a read naming another rank's SRQ succeeded")
	}
	if _, err := tr.TrySend(3, []byte("x")); err == nil {
		t.Error("the INI QP failed, yet a send toward its node was taken")
	}
}

// TestAfterClose: a closed transport refuses every call (rc's
// TestAfterClose).
func TestAfterClose(t *testing.T) {
	j := job(t, []int{0, 1}, false, softhca.Faults{}, nil)
	transporttest.AfterClose(t, j.ends[0].Tr, 1)
}

// TestPeerFailedReported: a frame from rank 0 naming an SRQ that is in no
// domain of node 1 fails, at node 1, the TGT QP of rank 0's INI QP (a
// Remote Access NAK, QP_ACCESS_ERR to both ranks of node 1, which share
// it) and so rank 0's INI QP toward node 1. Each rank that can no longer
// hear from a peer is told once (transport.PeerFailureHandler): ranks 1
// and 3 of rank 0 (nothing more comes from it: its TGT QP failed), rank
// 0 of ranks 1 and 3 (its INI QP toward their node failed: it can send
// nothing to them, read nothing from them, return them no credits).
// Rank 2 hears nothing, and the traffic between it and node 1 goes on.
// Before, no rank heard anything.
func TestPeerFailedReported(t *testing.T) {
	j := job(t, twoByTwo, false, softhca.Faults{}, nil)
	ends := j.ends
	transporttest.OneWay(t, ends, 0, 1, 5)
	ends[0].Tr.peers[1].SRQN = 0xfffffe
	if ok, err := ends[0].Tr.TrySend(1, []byte("x")); !ok || err != nil {
		t.Fatalf("send: %v, %v", ok, err)
	}
	heard := func(r, peer int) bool { return len(ends[r].H.Failed[peer]) > 0 }
	deadline := time.Now().Add(10 * time.Second)
	progress(t, ends, func() bool {
		return heard(0, 1) && heard(0, 3) && heard(1, 0) && heard(3, 0) || time.Now().After(deadline)
	})
	transporttest.OneWay(t, ends, 2, 1, 5)
	transporttest.OneWay(t, ends, 1, 2, 5)
	transporttest.OneWay(t, ends, 3, 2, 5)
	for range 100 {
		for _, e := range ends {
			if _, err := e.Tr.Progress(e.H); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := []struct {
		rank  int
		peers []int
		cause error
	}{{0, []int{1, 3}, verbs.WCRemAccessErr}, {1, []int{0}, verbs.EventQPAccessErr}, {2, nil, nil}, {3, []int{0}, verbs.EventQPAccessErr}}
	for _, w := range want {
		failed := ends[w.rank].H.Failed
		if len(failed) != len(w.peers) {
			t.Errorf("rank %d heard of failures %v; want ranks %v", w.rank, failed, w.peers)
		}
		for _, p := range w.peers {
			if errs := failed[p]; len(errs) != 1 || !errors.Is(errs[0], w.cause) {
				t.Errorf("rank %d heard of rank %d failing %v; want once, with %v", w.rank, p, errs, w.cause)
				continue
			}
			if _, err := ends[w.rank].Tr.TrySend(p, []byte("x")); err == nil {
				t.Errorf("rank %d: a send to failed rank %d", w.rank, p)
			}
		}
	}
}

// TestINIFailureDropsLaterFrames: when rank 0's INI QP toward node 1
// fails, ranks 1 and 3 are reported failed though their own INI QPs
// toward node 0 still work: rank 0 can no longer return their credits
// nor answer them. Their frames that came before the report are
// delivered; those after it are dropped, as the handler was told nothing
// more comes from them. Rank 2, on rank 0's node, still gets them.
func TestINIFailureDropsLaterFrames(t *testing.T) {
	j := job(t, twoByTwo, false, softhca.Faults{}, nil)
	ends := j.ends
	transporttest.OneWay(t, ends, 1, 0, 3)
	tr := ends[0].Tr
	boom := errors.New("boom")
	n1 := tr.peers[1].node
	tr.e.Fail(&n1.ini, n1.ini.Errorf("test: %w", boom))
	if _, err := tr.Progress(ends[0].H); err != nil {
		t.Fatal(err)
	}
	for _, r := range []int{1, 3} {
		if errs := ends[0].H.Failed[r]; len(errs) != 1 || !errors.Is(errs[0], boom) {
			t.Fatalf("rank 0 heard of rank %d failing %v; want once, with %v", r, errs, boom)
		}
	}
	for i := range 3 {
		if ok, err := ends[1].Tr.TrySend(0, pattern(100+i, 8)); !ok || err != nil {
			t.Fatalf("rank 1's send %d to rank 0: %v, %v", i, ok, err)
		}
	}
	transporttest.OneWay(t, ends, 1, 2, 3) // after rank 1's sends to rank 0, on the same INI QP
	for range 100 {
		for _, e := range ends {
			if _, err := e.Tr.Progress(e.H); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := len(ends[0].H.Frames[1]); n != 3 {
		t.Errorf("rank 0 got %d frames of rank 1; want the 3 sent before its report", n)
	}
	var m dto.Metric
	if err := tr.m.FailedPeerFrames.Write(&m); err != nil || m.GetCounter().GetValue() != 3 {
		t.Errorf("rank 0 counted %v frames of failed peers dropped (%v); want the 3 rank 1 sent after", m.GetCounter().GetValue(), err)
	}
	if n := len(ends[0].H.Failed); n != 2 {
		t.Errorf("rank 0 heard of failures %v; want ranks 1 and 3 once", ends[0].H.Failed)
	}
}

// TestDomainFileRemoved: the node's domain file does not outlive a
// transport that failed in New, or was closed before Connect (which
// removes it once every rank of the node has it open). It was left behind
// in the shared-memory directory.
func TestDomainFileRemoved(t *testing.T) {
	d := newDevice(t, softhca.NewFabric(), softhca.Faults{})
	c, err := d.Open(verbs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dir := t.TempDir()
	gone := func(what, path string) {
		t.Helper()
		if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: the domain file is still there (%v)", what, err)
		}
	}
	path := filepath.Join(dir, "failed")
	if _, err := New(Config{Device: c, Rank: 0, Nodes: []int{0, 1}, Kick: func() {}, DomainFile: path, Port: 9}); err == nil {
		t.Fatal("New on port 9: no error")
	}
	gone("New failed", path)
	path = filepath.Join(dir, "closed")
	tr, err := New(Config{Device: c, Rank: 0, Nodes: []int{0, 1}, Kick: func() {}, DomainFile: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("after New: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	gone("closed before Connect", path)
}
