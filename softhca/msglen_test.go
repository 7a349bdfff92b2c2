//go:build linux

package softhca

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca/roce"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// A message of 2^31 bytes, the largest, takes 2^23 packets at an MTU of
// 256: more than PSN comparisons can span (roce.MaxMessagePackets). The
// requester fails it with a local length error before sending anything.
func TestMessageTooManyPackets(t *testing.T) {
	r := newRigWith(t, verbstest.Options{MTU: verbs.MTU256})
	mr := r.twoGiB(t)
	// One SGE of 2 GiB does not fit an mlx4 data segment: the provider
	// refuses it.
	err := r.qp.PostSend(&verbs.SendWR{WRID: 8, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{mr.SGE(0, 1<<31)}, RemoteAddr: 0x1000, RKey: 0x77})
	var pe *verbs.PostError
	if !errors.As(err, &pe) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("post of a 2 GiB SGE: %v, want a PostError matching EINVAL", err)
	}
	if err := r.qp.PostSend(&verbs.SendWR{WRID: 9, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{mr.SGE(0, 1<<30), mr.SGE(1<<30, 1<<30)}, RemoteAddr: 0x1000, RKey: 0x77}); err != nil {
		t.Fatal(err)
	}
	if wc := pollWait(t, r.cq); wc.Status != verbs.WCLocLenErr || wc.WRID != 9 {
		t.Fatalf("completion %+v, want a local length error", wc)
	}
	if n := r.d.counters.XmitPackets.Load(); n != 0 {
		t.Errorf("%d packets sent for a message that was refused", n)
	}
}

// A READ request of 2^31 bytes at an MTU of 256, which would take 2^23
// responses, is an invalid request; one MTU less is not (it fails the key
// check instead).
func TestReadTooManyPackets(t *testing.T) {
	for _, c := range []struct {
		n    uint32
		want uint8
	}{{1 << 31, roce.NakInvalidRequest}, {1<<31 - 256, roce.NakRemoteAccess}} {
		r := newRigWith(t, verbstest.Options{MTU: verbs.MTU256})
		r.inject(func(p *roce.Packet) {
			p.Opcode, p.PSN, p.VA, p.RKey, p.DMALen = roce.ReadRequest, 0x1234, r.mr.Addr(), r.mr.RKey(), c.n
		})
		got := r.sink.collect(t, 1)
		if p := got[0]; p.Opcode.Op() != roce.Acknowledge || p.Syndrome != roce.AETHNak|c.want || p.PSN != 0x1234 {
			t.Errorf("READ of %d bytes: %v PSN %#x syndrome %#x, want a NAK %#x of PSN 0x1234", c.n, p.Opcode, p.PSN, p.Syndrome, c.want)
		}
	}
}

// Every PSN a requester has outstanding lies less than 2^23 past the last
// acknowledged one: a READ whose responses would end further waits for
// the READ before it, and that READ's responses are taken (with both
// outstanding, PSN comparisons dropped them as responses to requests never
// sent). At MTU 256 the first READ takes 2^23-1 PSNs, the most a message
// may.
func TestOutstandingWithinHalfPSNSpace(t *testing.T) {
	r := newRigWith(t, verbstest.Options{MTU: verbs.MTU256})
	q := r.d.qps.get(r.qp.Num())
	mr := r.twoGiB(t)
	if err := r.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{mr.SGE(0, 1<<31-256)}, RemoteAddr: 0x1000, RKey: 0x77,
		Next: &verbs.SendWR{WRID: 2, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{mr.SGE(0, 512)}, RemoteAddr: 0x1000, RKey: 0x77}}); err != nil {
		t.Fatal(err)
	}
	got := r.sink.collect(t, 1)
	time.Sleep(20 * time.Millisecond)
	if got = append(got, r.sink.drain()...); len(got) != 1 {
		t.Errorf("%d READ requests sent, want the first only", len(got))
	}
	errs := r.d.counters.RcvErrors.Load()
	r.inject(func(p *roce.Packet) {
		p.Opcode, p.PSN, p.Syndrome = roce.ReadResponseFirst, 0x1234, roce.AETHAck
		p.Payload = append(p.Payload[:0], bytes.Repeat([]byte{'R'}, 256)...)
	})
	waitFor(t, "the first response taken", func() bool {
		r.d.mu.Lock()
		defer r.d.mu.Unlock()
		return len(q.req.q) > 0 && q.req.q[0].rdGot == 256
	})
	if n := r.d.counters.RcvErrors.Load() - errs; n != 0 {
		t.Errorf("%d receive errors", n)
	}
}

// twoGiB registers 2 GiB of memory on the rig's PD for local writes. The
// tests touch little of it, and untouched memory takes none.
func (r *rig) twoGiB(t *testing.T) *verbs.MR {
	t.Helper()
	buf, err := verbs.Alloc(1 << 31)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { verbs.Free(buf) })
	mr, err := r.pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mr.Close() })
	return mr
}
