package softhca_test

import (
	"testing"

	"github.com/xrcrun/xrc/mlx4"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

// TestClientGoneFreesEverything drops a client that holds objects without
// destroying them, as a process that exits does: the device frees them all
// and another client carries on.
func TestClientGoneFreesEverything(t *testing.T) {
	d := newDevice(t, nil)
	other := open(t, d)
	k, err := d.Kernel()
	if err != nil {
		t.Fatal(err)
	}
	p, err := mlx4.Open(k)
	if err != nil {
		t.Fatal(err)
	}
	pd, err := p.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	buf, err := verbs.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer verbs.Free(buf)
	if _, err := pd.RegMR(uintptr(addrOf(buf)), 4096, verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	cq, err := p.CreateCQ(verbs.CQInit{CQE: 16})
	if err != nil {
		t.Fatal(err)
	}
	srq, err := pd.CreateSRQ(verbs.SRQInit{Attr: verbs.SRQAttr{MaxWR: 8, MaxSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := pd.CreateQP(verbs.QPInit{Type: verbs.QPTRC, SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: verbs.QPCap{MaxSendWR: 4}, Handle: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	got := d.Objects()
	if got.QPs != 3 || got.CQs != 1 || got.SRQs != 1 || got.MRs != 1 || got.PDs != 1 || got.Clients != 2 {
		t.Fatalf("objects %+v", got)
	}
	if err := k.Close(); err != nil { // the client goes away
		t.Fatal(err)
	}
	if got := d.Objects(); got != (softhca.Objects{Clients: 1}) {
		t.Fatalf("objects after the client left: %+v", got)
	}
	p.Close() // the provider's own memory and files
	// The other client still works.
	opd, err := other.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if err := opd.Close(); err != nil {
		t.Fatal(err)
	}
}
