package verbsx

import (
	"errors"
	"syscall"
	"testing"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

// TestRegCache: a buffer registered again, or a range inside it, hits
// the cache; unused entries stay until more than MaxIdle are unused,
// the least recently used going first; Unexpose finds entries by rkey.
func TestRegCache(t *testing.T) {
	rc := newRegCache(t)
	big := make([]byte, 3*int(pageSize)+100)
	e, err := rc.Get(big)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := rc.Get(big[2*pageSize+5 : 2*pageSize+50])
	if err != nil || inner != e || e.users != 2 {
		t.Fatalf("a range inside a registered buffer: %v, same entry %v, %d users", err, inner == e, e.users)
	}
	if f := rc.Find(e.addr, e.n, e.MR.RKey()); f != e {
		t.Fatal("find by rkey")
	}
	if f := rc.Find(e.addr, e.n, e.MR.RKey()+1); f != nil {
		t.Fatal("find with a wrong rkey")
	}
	rc.Put(e)
	rc.Put(e)
	if rc.entries != 1 || len(rc.idle) != 1 {
		t.Fatalf("%d entries, %d idle", rc.entries, len(rc.idle))
	}
	if f := rc.Find(e.addr, e.n, e.MR.RKey()); f != nil {
		t.Fatal("find an unused entry: Unexpose twice would succeed")
	}
	// Reuse takes the entry out of the idle list.
	if again, _ := rc.Get(big); again != e || len(rc.idle) != 0 {
		t.Fatal("reuse of an idle entry")
	}
	rc.Put(e)
	// More unused buffers than the cache keeps: the oldest go.
	bufs := make([][]byte, MaxIdle+5)
	for i := range bufs {
		bufs[i] = make([]byte, 64)
		x, err := rc.Get(bufs[i])
		if err != nil {
			t.Fatal(err)
		}
		if err := rc.Put(x); err != nil {
			t.Fatal(err)
		}
	}
	if len(rc.idle) != MaxIdle || rc.entries != MaxIdle {
		t.Fatalf("%d idle of %d entries, want %d", len(rc.idle), rc.entries, MaxIdle)
	}
	for _, x := range rc.byPage[e.addr&^(pageSize-1)] {
		if x == e {
			t.Fatal("the least recently used entry is still cached")
		}
	}
}

// TestRegCacheFree: verbs.Free of memory the cache keeps an unused region
// of closes that region and succeeds (it failed with EBUSY until the cache
// was closed); a region in use keeps Free failing, and other entries stay.
func TestRegCacheFree(t *testing.T) {
	rc := newRegCache(t)
	mem, err := verbs.Alloc(4 * int(pageSize))
	if err != nil {
		t.Fatal(err)
	}
	other := make([]byte, 100) // Go memory, not freed
	eo, err := rc.Get(other)
	if err != nil {
		t.Fatal(err)
	}
	e, err := rc.Get(mem[pageSize : 3*pageSize])
	if err != nil {
		t.Fatal(err)
	}
	if err := verbs.Free(mem); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("free of memory a region in use covers: %v, want EBUSY", err)
	}
	if rc.Entries() != 2 {
		t.Fatalf("%d entries after a failed free, want 2", rc.Entries())
	}
	if err := rc.Put(e); err != nil {
		t.Fatal(err)
	}
	if err := rc.Put(eo); err != nil {
		t.Fatal(err)
	}
	if err := verbs.Free(mem); err != nil {
		t.Fatalf("free of memory the cache keeps an unused region of: %v", err)
	}
	if rc.Entries() != 1 || len(rc.idle) != 1 || rc.idle[0] != eo {
		t.Fatalf("after the free: %d entries, idle %v; want the Go buffer's alone", rc.Entries(), rc.idle)
	}
}

// newRegCache makes a cache on a new device's PD, closed with the test.
func newRegCache(t *testing.T) *RegCache {
	t.Helper()
	_, c := newDevice(t, softhca.Faults{})
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	rc := NewRegCache(pd)
	t.Cleanup(func() {
		if err := rc.Close(); err != nil {
			t.Error(err)
		}
		if err := pd.Close(); err != nil {
			t.Error(err)
		}
	})
	return rc
}
