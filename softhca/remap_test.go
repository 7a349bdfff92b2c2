package softhca_test

import (
	"testing"
	"unsafe"

	"github.com/xrcrun/xrc/softhca/hcatest"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
	"golang.org/x/sys/unix"
)

// TestRemappedRegion: a client registers memory in verbs.Alloc memory,
// deregisters it, frees it, then maps other (anonymous) memory at the same
// address and registers that. A WRITE into the new region lands in the
// client's memory. The device served the new region from its view of the
// freed memfd, and the WRITE completed into memory the client no longer
// saw.
func TestRemappedRegion(t *testing.T) {
	dir := t.TempDir()
	a, b := hcatest.Start(t, dir), hcatest.Start(t, dir)
	env := verbstest.Env{Name: "remapped", Open: func(t testing.TB) (x, y *verbs.Context) { return attach(t, a), attach(t, b) }}
	pa, pb := verbstest.ConnectWith(t, env, 1<<16, verbstest.Options{})
	const n = 1 << 16
	old, err := verbs.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	m, err := pb.PD.RegMR(old, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	addr := unsafe.Pointer(&old[0])
	if err := verbs.Free(old); err != nil {
		t.Fatal(err)
	}
	p, err := unix.MmapPtr(-1, 0, addr, n, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED_NOREPLACE)
	if err != nil || p != addr {
		t.Skipf("could not map at %p: %v", addr, err)
	}
	mem := unsafe.Slice((*byte)(p), n)
	defer unix.MunmapPtr(p, n)
	m2, err := pb.PD.RegMR(mem, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	for i := range pa.Buf {
		pa.Buf[i] = byte(i) | 1
	}
	wr := &verbs.SendWR{WRID: 7, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{pa.MR.SGE(0, n)}, RemoteAddr: m2.Addr(), RKey: m2.RKey()}
	if err := pa.QP.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	waitWC(t, pa.CQ, 7)
	for i := range mem {
		if mem[i] != pa.Buf[i] {
			t.Fatalf("byte %d of the new region is %#x, want %#x: the WRITE went elsewhere", i, mem[i], pa.Buf[i])
		}
	}
}
