//go:build linux

package softhca_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/softhca/hcatest"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// TestPackedRingWrap: send queues of a few slots (no headroom when packed),
// slots of one and of several 64-byte blocks, filled to their capacity
// with chains of RDMA WRITEs (inline and not) and FETCH_ADDs, unsignaled
// but the last, thousands of times round the ring: every byte arrives and
// every atomic is executed once.
func TestPackedRingWrap(t *testing.T) {
	for _, lay := range []struct {
		name string
		open func(testing.TB, *softhca.Device) *verbs.Context
	}{{"packed", open}, {"hardware", openUnpacked}} {
		for _, sendWR := range []uint32{1, 2, 3, 5} {
			for _, inl := range []uint32{0, 100, 400, 900} {
				t.Run(fmt.Sprintf("%s/wr=%d/inline=%d", lay.name, sendWR, inl), func(t *testing.T) {
					f := softhca.NewFabric()
					ring(t, lay.open(t, newDevice(t, f)), lay.open(t, newDevice(t, f)), verbs.QPCap{MaxSendWR: sendWR, MaxRecvWR: 1, MaxSendSGE: 2, MaxRecvSGE: 1, MaxInlineData: inl})
				})
			}
		}
	}
}

// ring runs the load of TestPackedRingWrap between a QP of capacities cp
// on ca and one on cb.
func ring(t *testing.T, ca, cb *verbs.Context, cp verbs.QPCap) {
	const bufSize = 1 << 20
	type end struct {
		pd  *verbs.PD
		cq  *verbs.CQ
		buf []byte
		mr  *verbs.MR
		qp  *verbs.QP
		gid verbs.GID
	}
	mk := func(c *verbs.Context) *end {
		e := &end{}
		var err error
		p, err := c.QueryPort(1)
		if err != nil {
			t.Fatal(err)
		}
		e.gid = p.GID
		if e.pd, err = c.AllocPD(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.pd.Close() })
		if e.cq, err = c.CreateCQ(8, nil, 0); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.cq.Close() })
		if e.buf, err = verbs.Alloc(bufSize); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { verbs.Free(e.buf) })
		if e.mr, err = e.pd.RegMR(e.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.mr.Close() })
		if e.qp, err = e.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: e.cq, RecvCQ: e.cq, Cap: cp}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.qp.Close() })
		return e
	}
	a, b := mk(ca), mk(cb)
	verbstest.BringUp(t, a.qp, b.gid, b.qp.Num())
	verbstest.BringUp(t, b.qp, a.gid, a.qp.Num())
	maxPost := int(a.qp.Cap().MaxSendWR)
	t.Logf("cap %+v", a.qp.Cap())
	maxInl := int(a.qp.Cap().MaxInlineData)
	rng := rand.New(rand.NewPCG(uint64(maxPost), uint64(maxInl)))
	const counter = bufSize - 8
	var adds uint64
	wc := make([]verbs.WorkCompletion, 4)
	for it := range 1500 {
		wrs := make([]verbs.SendWR, maxPost)
		type exp struct {
			off  int
			data []byte
		}
		var want []exp
		var fa []int
		for j := range wrs {
			w := &wrs[j]
			w.WRID = uint64(it*100 + j)
			if rng.IntN(5) == 0 {
				res := 512*1024 + j*8
				*w = verbs.SendWR{WRID: w.WRID, Opcode: verbs.WRAtomicFetchAdd, SG: []verbs.SGE{a.mr.SGE(res, 8)},
					RemoteAddr: b.mr.Addr() + counter, RKey: b.mr.RKey(), CompareAdd: 1}
				fa = append(fa, res)
				continue
			}
			n := 1 + rng.IntN(300)
			src := j * 4096
			fill := byte(rng.Uint32())
			for k := range n {
				a.buf[src+k] = fill + byte(k)
			}
			dst := 256*1024 + j*4096
			w.Opcode = verbs.WRRDMAWrite
			w.RemoteAddr, w.RKey = b.mr.Addr()+uint64(dst), b.mr.RKey()
			if n <= maxInl && rng.IntN(2) == 0 {
				w.Flags |= verbs.SendInline
				w.SG = []verbs.SGE{a.mr.SGE(src, n/2), a.mr.SGE(src+n/2, n-n/2)}
			} else {
				w.SG = []verbs.SGE{a.mr.SGE(src, n/2), a.mr.SGE(src+n/2, n-n/2)}
			}
			want = append(want, exp{dst, append([]byte(nil), a.buf[src:src+n]...)})
		}
		for j := range wrs[:len(wrs)-1] {
			wrs[j].Next = &wrs[j+1]
		}
		wrs[len(wrs)-1].Flags |= verbs.SendSignaled
		if err := a.qp.PostSend(&wrs[0]); err != nil {
			t.Fatalf("iteration %d: post: %v", it, err)
		}
		deadline := time.Now().Add(10 * time.Second)
		got := 0
		for got == 0 {
			n, err := a.cq.Poll(wc)
			if err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				if wc[0].Status != verbs.WCSuccess || wc[0].WRID != wrs[len(wrs)-1].WRID {
					t.Fatalf("iteration %d: completion %+v", it, wc[0])
				}
				got = n
			}
			if time.Now().After(deadline) {
				t.Fatalf("iteration %d: no completion", it)
			}
		}
		for _, e := range want {
			if !bytes.Equal(b.buf[e.off:e.off+len(e.data)], e.data) {
				t.Fatalf("iteration %d: write at %d differs", it, e.off)
			}
		}
		for _, r := range fa {
			if v := binary.NativeEndian.Uint64(a.buf[r:]); v != adds { // as the conformance suite has it
				t.Fatalf("iteration %d: fetch-add returned %d, want %d", it, v, adds)
			}
			adds++
		}
		if v := binary.NativeEndian.Uint64(b.buf[counter:]); v != adds {
			t.Fatalf("iteration %d: counter %d, want %d", it, v, adds)
		}
	}
}

// TestPackedRingWrapOutOfProcess: the same through device processes
// (remoteKernel: queue memory in memfd chunks, small buffers inside them).
func TestPackedRingWrapOutOfProcess(t *testing.T) {
	dir := t.TempDir()
	for _, sendWR := range []uint32{1, 3} {
		for _, inl := range []uint32{0, 400} {
			t.Run(fmt.Sprintf("wr=%d/inline=%d", sendWR, inl), func(t *testing.T) {
				sa, sb := hcatest.Start(t, dir), hcatest.Start(t, dir)
				ring(t, attach(t, sa), attach(t, sb), verbs.QPCap{MaxSendWR: sendWR, MaxRecvWR: 1, MaxSendSGE: 2, MaxRecvSGE: 1, MaxInlineData: inl})
			})
		}
	}
}
