//go:build linux

package softhca

import (
	"context"
	"net/netip"
	"os"
	"testing"

	"github.com/xrcrun/xrc/verbs"
)

// TestSRQNumbersWrap: SRQ numbers stay within the 24 bits that the
// XRCETH and a CQE carry, and freed ones are given out again. They were
// counted up without end: after 2^24 SRQs a device could make no XRC SRQ
// that mlx4 would take.
func TestSRQNumbersWrap(t *testing.T) {
	d, err := New(context.Background(), Config{Name: "srqwrap0", Addr: netip.MustParseAddr("127.7.9.1"), Fabric: NewFabric()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := d.Open(verbs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	cq, err := c.CreateCQ(16, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	x, err := c.OpenXRCD(nil, os.O_CREATE)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	live, err := pd.CreateXRCSRQ(x, cq, verbs.SRQAttr{MaxWR: 4, MaxSGE: 1}) // number 1, kept
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	d.mu.Lock()
	d.nextSRQ = 1<<24 - 2 // as after that many SRQs came and went
	d.mu.Unlock()
	var got []uint32
	for range 3 {
		s, err := pd.CreateXRCSRQ(x, cq, verbs.SRQAttr{MaxWR: 4, MaxSGE: 1})
		if err != nil {
			t.Fatalf("XRC SRQ after %#x: %v", got, err)
		}
		got = append(got, s.Num())
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if want := []uint32{1<<24 - 2, 1<<24 - 1, 2}; got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("SRQ numbers %#x, want %#x (1 is in use)", got, want)
	}
}
