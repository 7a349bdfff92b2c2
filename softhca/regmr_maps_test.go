//go:build linux

package softhca

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xrcrun/xrc/mlx4"
	"github.com/xrcrun/xrc/verbs"
)

// TestRegMRMapsReadUnlocked: a REG_MR reads the client's /proc/<pid>/maps
// (as get_user_pages would walk its page tables) without holding the
// device's mutex, so that a client whose maps take long to read (a very
// large map, or one it keeps changing) holds up only itself, not the
// engine and every other client. The read was done under d.mu.
func TestRegMRMapsReadUnlocked(t *testing.T) {
	var armed atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	// The hook is set before the service's goroutines start and restored
	// after they end.
	saved := readMaps
	readMaps = func(pid int) ([]byte, error) {
		if armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
		return saved(pid)
	}
	d, err := New(context.Background(), Config{Name: "mapsread0", Addr: netip.MustParseAddr("127.93.0.1"), SpinIdle: -1})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, dir) }()
	t.Cleanup(func() {
		cancel()
		<-served
		d.Close()
		readMaps = saved
	})

	// The client whose maps read stalls, in "another process".
	var k mlx4.Kernel
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		if k, err = Attach(ctx, dir, "mapsread0"); err == nil {
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatal(err)
		}
	}
	p, err := mlx4.Open(k)
	if err != nil {
		k.Close()
		t.Fatal(err)
	}
	slow := verbs.NewContext("mapsread0", p, verbs.Config{})
	defer slow.Close()
	slowPD, err := slow.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer slowPD.Close()
	// Another client.
	other, err := d.Open(verbs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	buf := make([]byte, 4096)
	armed.Store(true)
	defer unblock() // before the contexts close
	registered := make(chan error, 1)
	go func() {
		mr, err := slowPD.RegMR(buf, verbs.AccessLocalWrite)
		if err == nil {
			err = mr.Close()
		}
		registered <- err
	}()
	select {
	case <-entered:
	case err := <-registered:
		t.Fatalf("REG_MR did not read the client's maps: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("REG_MR never read the client's maps")
	}
	// The REG_MR is in its maps read. The other client's command goes
	// through meanwhile.
	done := make(chan error, 1)
	go func() {
		pd, err := other.AllocPD()
		if err == nil {
			err = pd.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("another client's ALLOC_PD waited 30s for a REG_MR's read of /proc/<pid>/maps: the read holds the device's mutex")
	}
	unblock()
	if err := <-registered; err != nil {
		t.Fatalf("REG_MR after its maps read: %v", err)
	}
}
