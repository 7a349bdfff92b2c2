package rc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/transport"
	"github.com/xrcrun/xrc/transport/internal/transporttest"
	"github.com/xrcrun/xrc/transport/internal/verbsx"
	"github.com/xrcrun/xrc/verbs"
)

func twoDevices(t *testing.T) []*verbs.Context {
	da, a := newDevice(t, softhca.Faults{})
	db, b := newDevice(t, softhca.Faults{})
	t.Cleanup(func() {
		// Credits keep every sender within the receiver's buffers.
		for _, d := range []*softhca.Device{da, db} {
			if n := d.Counters().RNRNaksSent.Load(); n > 0 {
				t.Errorf("%s: %d RNR NAKs sent", d.Name(), n)
			}
		}
	})
	return []*verbs.Context{a, b}
}

// TestCredits: a sender whose receiver does not progress sends its share
// of the receiver's buffers, then is refused; once the receiver delivers,
// the credits come back (in a credit message: nothing goes the other
// way) and the rest goes.
func TestCredits(t *testing.T) {
	reg := prometheus.NewRegistry()
	ends := job(t, twoDevices(t), func(c *Config) {
		c.SRQDepth = 16
		if c.Rank == 1 {
			c.Registerer = reg
		}
	})
	want := 16 - 3
	sent := 0
	for {
		ok, err := ends[0].Tr.TrySend(1, []byte{byte(sent)})
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		sent++
	}
	if sent != want {
		t.Fatalf("sent %d frames before the receiver progressed, want its %d credits", sent, want)
	}
	const total = 200
	progress(t, ends, func() bool {
		for sent < total {
			ok, err := ends[0].Tr.TrySend(1, []byte{byte(sent)})
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			sent++
		}
		return len(ends[1].H.Frames[0]) == total
	})
	for i, f := range ends[1].H.Frames[0] {
		if len(f) != 1 || f[0] != byte(i) {
			t.Fatalf("frame %d: %v", i, f)
		}
	}
	if metricValues(t, reg)["xrc_rc_credit_messages_sent_total"] == 0 {
		t.Error("the receiver sent no credit message")
	}
}

// stream sends n frames each way between ends 0 and 1, of sizes from 0
// bytes to the eager size, keeping as many in flight as the transport
// takes, and checks that they arrive intact and in order.
func stream(t *testing.T, ends []*end, n int) {
	t.Helper()
	sent := [2]int{}
	largest := ends[0].Tr.MaxEager()
	frame := func(from, i int) [][]byte { return transporttest.Frame(from*100000, i, largest) }
	progress(t, ends, func() bool {
		for from := range 2 {
			for sent[from] < n {
				ok, err := ends[from].Tr.TrySend(1-from, frame(from, sent[from])...)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				sent[from]++
			}
		}
		return len(ends[0].H.Frames[1]) == n && len(ends[1].H.Frames[0]) == n
	})
	for to := range 2 {
		from := 1 - to
		for i, f := range ends[to].H.Frames[from] {
			want := frame(from, i)
			if !bytes.Equal(f, append(want[0], want[1]...)) {
				t.Fatalf("frame %d from %d: %d bytes, differs (want %d)", i, from, len(f), transporttest.FrameSize(i, largest))
			}
		}
	}
}

// TestFrames: thousands of frames each way, more than the credits and
// the send queue hold, arrive in order; credits come back.
func TestFrames(t *testing.T) {
	reg := prometheus.NewRegistry()
	ends := job(t, twoDevices(t), func(c *Config) {
		c.SRQDepth = 64 // few credits: the senders stall and get them back
		if c.Rank == 0 {
			c.Registerer = reg
		}
	})
	stream(t, ends, 3000)
	st := ends[0].Tr.Stats()
	if st.QPs != 1 || st.Connected != 1 || st.SRQs != 1 || st.RegisteredBytes <= 0 || st.QueueBytes <= 0 {
		t.Errorf("stats: %+v", st)
	}
	got := metricValues(t, reg)
	if got["xrc_rc_sent_frames_total"] != 3000 || got["xrc_rc_received_frames_total"] != 3000 || got["xrc_rc_qps"] != 1 {
		t.Errorf("metrics: %v", got)
	}
	if got["xrc_rc_credit_messages_received_total"]+got["xrc_rc_credit_messages_sent_total"] == 0 {
		t.Logf("no credit messages (all credits piggybacked): %v", got)
	}
}

// TestReads: reads of 1 byte to 8 MiB (several chunks), and of a part of
// the exposed buffer, bring the right bytes; the registrations are
// cached and released.
func TestReads(t *testing.T) {
	ends := job(t, twoDevices(t), nil)
	var cookie uint64
	for _, n := range []int{1, 100, 4096, 4097, 1 << 20, 1<<20 + 1, 3<<20 + 17, 8 << 20} {
		src := pattern(n, n)
		rm, err := ends[1].Tr.Expose(src)
		if err != nil {
			t.Fatal(err)
		}
		if len(rm) > transport.MaxRemote {
			t.Fatalf("remote of %d bytes", len(rm))
		}
		for _, part := range []int{n, n / 2} {
			dst := make([]byte, part)
			cookie++
			c := cookie
			if err := ends[0].Tr.Read(1, dst, rm, c); err != nil {
				t.Fatal(err)
			}
			progress(t, ends, func() bool { _, ok := ends[0].H.Reads[c]; return ok })
			if err := ends[0].H.Reads[c]; err != nil {
				t.Fatalf("read %d of %d: %v", part, n, err)
			}
			if !bytes.Equal(dst, src[:part]) {
				t.Fatalf("read %d of %d bytes: differs", part, n)
			}
		}
		if err := ends[1].Tr.Unexpose(rm); err != nil {
			t.Fatal(err)
		}
	}
	// Many reads at once from the same buffer, in both directions.
	src := [2][]byte{pattern(1, 64<<10), pattern(2, 64<<10)}
	var rms [2]transport.Remote
	for i := range 2 {
		var err error
		if rms[i], err = ends[i].Tr.Expose(src[i]); err != nil {
			t.Fatal(err)
		}
	}
	dsts := map[uint64][]byte{}
	for i := range 100 {
		for r := range 2 {
			cookie++
			d := make([]byte, 64<<10)
			dsts[cookie] = d
			if err := ends[r].Tr.Read(1-r, d, rms[1-r], cookie); err != nil {
				t.Fatal(err)
			}
		}
		_ = i
	}
	progress(t, ends, func() bool { return len(ends[0].H.Reads)+len(ends[1].H.Reads) >= len(dsts)+16 })
	for c, d := range dsts {
		r := 0
		if _, ok := ends[0].H.Reads[c]; !ok {
			r = 1
		}
		if err := ends[r].H.Reads[c]; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(d, src[1-r]) {
			t.Fatalf("read %d differs", c)
		}
	}
	for i := range 2 {
		if err := ends[i].Tr.Unexpose(rms[i]); err != nil {
			t.Fatal(err)
		}
	}
	if st := ends[0].Tr.Stats(); st.CachedRegions == 0 || st.CachedRegions > verbsx.MaxIdle {
		t.Errorf("stats: %+v", st)
	}
}

// TestBadInput: remotes of another transport, of another rank or too
// short, unexposing what was not exposed, frames too large and ranks on
// the same node are refused with clear errors; nothing is posted.
func TestBadInput(t *testing.T) {
	ends := job(t, twoDevices(t), nil)
	tr := ends[0].Tr
	buf := make([]byte, 100)
	good, err := ends[1].Tr.Expose(buf)
	if err != nil {
		t.Fatal(err)
	}
	shmLike := make([]byte, 20)
	wrongRank := append(transport.Remote(nil), good...)
	binary.LittleEndian.PutUint32(wrongRank[4:], 0)
	for name, tc := range map[string]struct {
		dst []byte
		src transport.Remote
	}{
		"other transport": {make([]byte, 10), shmLike},
		"wrong rank":      {make([]byte, 10), wrongRank},
		"too short":       {make([]byte, 101), good},
		"empty":           {make([]byte, 1), nil},
	} {
		if err := tr.Read(1, tc.dst, tc.src, 1); !errors.Is(err, transport.ErrBadRemote) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := tr.Unexpose(good); !errors.Is(err, transport.ErrBadRemote) {
		t.Errorf("unexpose another rank's remote: %v", err)
	}
	mine, _ := tr.Expose(buf)
	if err := tr.Unexpose(mine); err != nil {
		t.Fatal(err)
	}
	if err := tr.Unexpose(mine); !errors.Is(err, transport.ErrBadRemote) {
		t.Errorf("unexpose twice: %v", err)
	}
	if ok, err := tr.TrySend(1, make([]byte, tr.MaxEager()+1)); ok || err == nil {
		t.Errorf("oversized frame: %v, %v", ok, err)
	}
	if _, err := tr.TrySend(0, []byte("x")); !errors.Is(err, transport.ErrUnreachable) {
		t.Errorf("send to a rank of this node: %v", err)
	}
	if err := tr.Read(5, buf, good, 1); !errors.Is(err, transport.ErrUnreachable) {
		t.Errorf("read from no rank: %v", err)
	}
	if err := ends[1].Tr.Unexpose(good); err != nil {
		t.Fatal(err)
	}
	// A zero-length read completes without the network.
	if err := tr.Read(1, nil, good, 77); err != nil {
		t.Fatal(err)
	}
	progress(t, ends, func() bool { _, ok := ends[0].H.Reads[77]; return ok })
}

// TestRecords: malformed records are refused by Connect.
func TestRecords(t *testing.T) {
	_, c := newDevice(t, softhca.Faults{})
	tr, err := New(Config{Device: c, Rank: 0, Nodes: []int{0, 1}, Kick: func() {}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	good := tr.Record()
	for name, rec := range map[string][]byte{
		"empty":       nil,
		"version":     append([]byte{9}, good[1:]...),
		"short":       good[:len(good)-1],
		"no QP for 0": good, // rank 0's own record names no QP for itself
	} {
		err := tr.Connect(context.Background(), []transport.Peer{{Rank: 0, Record: good}, {Rank: 1, Node: 1, Record: rec}})
		if err == nil {
			t.Errorf("%s: connected", name)
		}
	}
}

// FuzzRecord: parsing never panics, and what parses encodes back the same.
func FuzzRecord(f *testing.F) {
	f.Add((&record{mtu: verbs.MTU1024, qpns: []uint32{0, 0x48}, psns: []uint32{0, 5}}).encode(), 2)
	f.Add([]byte(verbsx.Remote{Rank: 1, Addr: 0x1000, RKey: 7, Len: 64}.Encode(remoteMagic)), 2)
	f.Add(hello{kind: kindHello, rank: 1, qpn: 0x48, psn: 5}.encode(), 2)
	f.Add([]byte{1, 3, 0, 0, 1, 0, 0, 0}, 1)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > 1000 {
			return
		}
		// The record, the Remote and the lazy connection message: each
		// either fails to parse or encodes back to the same bytes (but
		// the record's two reserved bytes).
		if r, err := parseRecord(b, n); err == nil {
			if out := r.encode(); !bytes.Equal(out[4:], b[4:]) || out[0] != b[0] || out[1] != b[1] {
				t.Fatalf("round trip of %x", b)
			}
		}
		if rm, ok := verbsx.ParseRemote(b, remoteMagic); ok {
			if out := rm.Encode(remoteMagic); !bytes.Equal(out, b) || rm.Addr+rm.Len < rm.Addr {
				t.Fatalf("Remote %x parsed as %+v, encodes as %x", b, rm, out)
			}
		}
		if h, err := parseHello(b, n); err == nil {
			if out := h.encode(); !bytes.Equal(out, b) || h.rank < 0 || h.rank >= n || h.qpn == 0 || h.qpn >= 1<<24 {
				t.Fatalf("connection message %x parsed as %+v, encodes as %x", b, h, out)
			}
		}
	})
}

// metricValues gathers reg's counters and gauges by name.
func metricValues(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.Counter != nil {
				got[mf.GetName()] = m.Counter.GetValue()
			} else if m.Gauge != nil {
				got[mf.GetName()] = m.Gauge.GetValue()
			}
		}
	}
	return got
}

// TestOvercommit: more peers than receive buffers. Six senders with their
// minimum of 2 credits each fill a receiver's SRQ of 8 while it does not
// progress: the SRQ limit event fires, the senders' last frames meet RNR
// NAKs and are retried, and once the receiver progresses every frame
// arrives, in order per sender. The receiver starts progressing only once
// it sent an RNR NAK: were it to repost its buffers sooner, the last
// frames could find them and meet none.
func TestOvercommit(t *testing.T) {
	d, c0 := newDevice(t, softhca.Faults{})
	ctxs := []*verbs.Context{c0}
	for range 6 {
		c, err := d.Open(verbs.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ctxs = append(ctxs, c)
	}
	reg := prometheus.NewRegistry()
	ends := job(t, ctxs, func(c *Config) {
		c.SRQDepth = 8
		if c.Rank == 0 {
			c.Registerer = reg
		}
	})
	if ends[1].Tr.e.Credits() != 2 {
		t.Fatalf("%d credits, want the minimum of 2", ends[1].Tr.e.Credits())
	}
	for _, e := range ends[1:] {
		for i := range 2 {
			if ok, err := e.Tr.TrySend(0, []byte{byte(e.Tr.cfg.Rank), byte(i)}); !ok || err != nil {
				t.Fatalf("send: %v, %v", ok, err)
			}
		}
	}
	// Wait (while the senders progress) for the receiver's limit event
	// and its first RNR NAK (all ranks share the device d, whose
	// responder is the receiver's). Until it progresses, nothing reposts
	// its buffers (the limit event finds none free), so the frames beyond
	// the 8 buffers meet RNR NAKs. The deadline only turns a hang into a
	// failure.
	limited := func() bool { return metricValues(t, reg)["xrc_rc_srq_limit_events_total"] > 0 }
	nakSent := func() bool { return d.Counters().RNRNaksSent.Load() > 0 }
	deadline := time.Now().Add(time.Minute)
	progress(t, ends[1:], func() bool { return limited() && nakSent() || time.Now().After(deadline) })
	if !limited() || !nakSent() {
		t.Fatalf("limit event: %v, RNR NAK sent: %v; want both: the SRQ was not overcommitted", limited(), nakSent())
	}
	progress(t, ends, func() bool {
		n := 0
		for r := 1; r < len(ends); r++ {
			n += len(ends[0].H.Frames[r])
		}
		return n == 12
	})
	for r := 1; r < len(ends); r++ {
		for i, f := range ends[0].H.Frames[r] {
			if f[0] != byte(r) || f[1] != byte(i) {
				t.Fatalf("frame %d from %d: %v", i, r, f)
			}
		}
	}
}

// TestPeerFails: a read with a key the peer never gave fails at the
// peer's HCA, which breaks the connection (as RC does): the read ends
// with an error naming the peer, and so does every later call toward it.
func TestPeerFails(t *testing.T) {
	ends := job(t, twoDevices(t), nil)
	rm := forgedRead(t, ends, 5)
	progress(t, ends, func() bool { _, ok := ends[0].H.Reads[5]; return ok })
	if err := ends[0].H.Reads[5]; err == nil || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("read with a forged key: %v", err)
	}
	if _, err := ends[0].Tr.TrySend(1, []byte("x")); err == nil {
		t.Fatal("send to a failed peer")
	}
	if err := ends[0].Tr.Read(1, make([]byte, 10), rm, 6); err == nil {
		t.Fatal("read from a failed peer")
	}
	if err := ends[1].Tr.Unexpose(rm); err != nil {
		t.Fatal(err)
	}
}

// forgedRead has rank 1 expose a buffer and rank 0 read it, as cookie,
// with a key rank 1 never gave, which breaks their connection. It returns
// what rank 1 exposed.
func forgedRead(t *testing.T, ends []*end, cookie uint64) transport.Remote {
	t.Helper()
	rm, err := ends[1].Tr.Expose(make([]byte, 4096))
	if err != nil {
		t.Fatal(err)
	}
	forged := append(transport.Remote(nil), rm...)
	binary.LittleEndian.PutUint32(forged[16:], binary.LittleEndian.Uint32(rm[16:])^0xff00)
	if err := ends[0].Tr.Read(1, make([]byte, 100), forged, cookie); err != nil {
		t.Fatal(err)
	}
	return rm
}

// TestAfterClose: a closed transport refuses every call; TrySend used to
// copy into the send buffers Close had unmapped, and crash the process.
func TestAfterClose(t *testing.T) {
	ends := job(t, twoDevices(t), nil)
	transporttest.AfterClose(t, ends[0].Tr, 1)
}

// TestPeerFailedReported: a connection that fails for good is reported to
// a transport.PeerFailureHandler once, on both sides, with an error that
// says why. A read with a key rank 1 never gave breaks it: rank 0 learns
// from the read's completion (REM_ACCESS_ERR), rank 1, which has no work
// of its own on the QP, only from the QP's async event (QP_ACCESS_ERR).
// Before, neither heard of it: comm's receives from the peer waited for
// ever.
func TestPeerFailedReported(t *testing.T) {
	ends := job(t, twoDevices(t), nil)
	stream(t, ends, 10) // frames both ways before the failure are delivered
	rm := forgedRead(t, ends, 5)
	deadline := time.Now().Add(10 * time.Second)
	progress(t, ends, func() bool {
		if time.Now().After(deadline) {
			t.Fatalf("no peer failure reported in 10 s: rank 0 heard %v, rank 1 %v", ends[0].H.Failed, ends[1].H.Failed)
		}
		return len(ends[0].H.Failed[1]) > 0 && len(ends[1].H.Failed[0]) > 0
	})
	// More progress reports nothing more.
	for range 100 {
		for _, e := range ends {
			if _, err := e.Tr.Progress(e.H); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(r, peer int, cause error) {
		t.Helper()
		errs := ends[r].H.Failed
		if len(errs) != 1 || len(errs[peer]) != 1 {
			t.Fatalf("rank %d heard of failures %v; want rank %d once", r, errs, peer)
		}
		err := errs[peer][0]
		if !errors.Is(err, cause) || !strings.Contains(err.Error(), fmt.Sprintf("rc: rank %d:", peer)) {
			t.Errorf("rank %d: rank %d failed with %q; want it to name the rank and wrap %v", r, peer, err, cause)
		}
		if _, err := ends[r].Tr.TrySend(peer, []byte("x")); err == nil {
			t.Errorf("rank %d: a send to failed rank %d", r, peer)
		}
		if err := ends[r].Tr.Read(peer, make([]byte, 10), rm, 6); err == nil {
			t.Errorf("rank %d: a read from failed rank %d", r, peer)
		}
	}
	check(0, 1, verbs.WCRemAccessErr)
	check(1, 0, verbs.EventQPAccessErr)
	if err := ends[1].Tr.Unexpose(rm); err != nil {
		t.Fatal(err)
	}
}
