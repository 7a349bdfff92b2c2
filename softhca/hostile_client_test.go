//go:build linux

package softhca

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	xunix "golang.org/x/sys/unix"

	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/unix"
)

// What a client of a device process may do to it: none of it may crash
// the device, which serves the node's other processes too.

// TestQueueBoundsWrap: a queue range near 2^64 is refused. Its bounds
// check added the range's length to its offset, which wrapped around, and
// slicing the queue then panicked with the device's mutex held.
func TestQueueBoundsWrap(t *testing.T) {
	var q queueTable
	q.addQueue(0x1000, make([]byte, 0x1000))
	for _, c := range []struct {
		addr uint64
		n    int
	}{
		{^uint64(0) - 0xfff, 0x2000}, // off 2^64-0x2000, wraps to 0
		{^uint64(0) - 3, 0x1004},
		{0x1800, 0x801},
	} {
		if b, err := q.queue(c.addr, c.n); !errors.Is(err, syscall.EFAULT) {
			t.Errorf("%d bytes at %#x: %d bytes, %v", c.n, c.addr, len(b), err)
		}
	}
	if b, err := q.queue(0x1800, 0x800); err != nil || len(b) != 0x800 {
		t.Errorf("the queue's second half: %d bytes, %v", len(b), err)
	}
}

// TestUnsealedMemoryRefused: the device maps only memory the client cannot
// shrink under it: a memfd sealed against shrinking, as unix.Memfd makes.
// A client that kept an unsealed file's descriptor could truncate it, and
// the device's next access to the mapping killed it with SIGBUS.
func TestUnsealedMemoryRefused(t *testing.T) {
	w := newSvcWorld(t)
	defer w.close()
	sess := w.session(t)
	defer sess.close()
	w.request(t, sess, svcHello, w.goodHello())
	fd, err := xunix.MemfdCreate("unsealed", xunix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := xunix.Ftruncate(fd, 64<<10); err != nil {
		t.Fatal(err)
	}
	for _, t0 := range []msgType{msgAddQueue, msgAddRegion} {
		a := sess.request(appendRequest(nil, t0, 0x10000, 64<<10), unix.Rights(fd), 0, nil)
		if _, err := parseReply(a.reply, t0); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%v of an unsealed memfd: %v", t0, err)
		}
	}
	// The same with memory of unix.Memfd is taken.
	sealed := memfds(t, 1, 64<<10)
	a := sess.request(appendRequest(nil, msgAddQueue, 0x10000, 64<<10), unix.Rights(sealed...), 0, nil)
	if _, err := parseReply(a.reply, msgAddQueue); err != nil {
		t.Errorf("add-queue of a sealed memfd: %v", err)
	}
	unix.Close(sealed[0])
}

// TestDoorbellsAfterDeviceGone: once the device has stopped, a client's
// doorbells are dropped (its QPs are in the error state then) instead of
// waiting forever for room in a bell ring that no engine drains.
func TestDoorbellsAfterDeviceGone(t *testing.T) {
	dir, stop := serveForTest(t, "bellsgone", "127.7.4.1")
	k, err := Attach(context.Background(), dir, "bellsgone")
	if err != nil {
		t.Fatal(err)
	}
	u, err := k.MapUAR()
	if err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		for range 2*bellEntries + 1 {
			u.Write32(mlx4hw.UARCQDoorbell, 0)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("doorbells still waiting for room a minute after the device stopped")
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	u.Write32(mlx4hw.UARCQDoorbell, 0) // after Close: dropped, not written to the unmapped ring
}

// TestClientMappingsBounded: the device maps a bounded number of pieces of
// its clients' memory (each is one of the process's vm.max_map_count, past
// which the runtime cannot grow its heap); past the bound, adding memory
// fails with ENOMEM, freeing some makes room, and a client's end gives
// back all it held.
func TestClientMappingsBounded(t *testing.T) {
	w := newSvcWorld(t)
	defer w.close()
	base := w.d.maps.n.Load()
	w.d.maps.max = base + 4
	sess := w.session(t)
	w.request(t, sess, svcHello, w.goodHello()) // its bell ring: 1
	add := func(addr uint64) error {
		a := sess.request(appendRequest(nil, msgAddQueue, addr, 4096), unix.Rights(memfds(t, 1, 4096)...), 0, nil)
		_, err := parseReply(a.reply, msgAddQueue)
		return err
	}
	for i := range 3 {
		if err := add(0x10000 + uint64(i)*0x1000); err != nil {
			t.Fatalf("queue memory %d of 3: %v", i, err)
		}
	}
	if err := add(0x20000); !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("queue memory past the bound: %v", err)
	}
	a := sess.request(appendRequest(nil, msgRemoveQueue, 0x10000), nil, 0, nil)
	if _, err := parseReply(a.reply, msgRemoveQueue); err != nil {
		t.Fatal(err)
	}
	if err := add(0x20000); err != nil {
		t.Fatalf("queue memory once some was freed: %v", err)
	}
	sess.close()
	if n := w.d.maps.n.Load(); n != base {
		t.Fatalf("%d mappings counted after the client ended, %d before it", n, base)
	}
}

// TestClientMappedBytesBounded: the device maps a bounded number of bytes
// of its clients' memory too (a mapping takes address space whatever its
// pages hold, and one region's may be up to maxMRSize, so a few clients
// could otherwise fill the device's address space); past the bound,
// adding memory fails with ENOMEM and the device carries on, freeing some
// makes room, and a client's end gives back all it held.
func TestClientMappedBytesBounded(t *testing.T) {
	w := newSvcWorld(t)
	defer w.close()
	base := w.d.maps.bytes.Load()
	w.d.maps.maxBytes = base + bellSize + 3<<20
	sess := w.session(t)
	w.request(t, sess, svcHello, w.goodHello())
	add := func(addr uint64, size int) error {
		a := sess.request(appendRequest(nil, msgAddQueue, addr, uint64(size)), unix.Rights(memfds(t, 1, size)...), 0, nil)
		_, err := parseReply(a.reply, msgAddQueue)
		return err
	}
	if err := add(0x10000000, 2<<20); err != nil {
		t.Fatalf("2 MiB of queue memory under a 3 MiB bound: %v", err)
	}
	if err := add(0x20000000, 2<<20); !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("2 MiB more, past the bound: %v", err)
	}
	if err := add(0x30000000, 1<<20); err != nil {
		t.Fatalf("the last 1 MiB under the bound: %v", err)
	}
	a := sess.request(appendRequest(nil, msgRemoveQueue, 0x10000000), nil, 0, nil)
	if _, err := parseReply(a.reply, msgRemoveQueue); err != nil {
		t.Fatal(err)
	}
	if err := add(0x20000000, 2<<20); err != nil {
		t.Fatalf("2 MiB once 2 MiB were freed: %v", err)
	}
	sess.close()
	if n := w.d.maps.bytes.Load(); n != base {
		t.Fatalf("%d bytes counted as mapped after the client ended, %d before it", n, base)
	}
}

// serveForTest serves a new device named name at addr in a temporary
// directory, which it returns once the device answers there, with a
// stop that ends the serving (and the device) and returns Serve's error;
// the test's end stops it too if the test did not.
func serveForTest(t *testing.T, name, addr string) (dir string, stop func() error) {
	t.Helper()
	d, err := New(context.Background(), Config{Name: name, Addr: netip.MustParseAddr(addr), SpinIdle: -1})
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, dir) }()
	stop = sync.OnceValue(func() error {
		cancel()
		err := <-served
		return errors.Join(err, d.Close())
	})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	// Answered, not only there: the socket's file is made before it
	// listens.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		_, err := QueryCounters(context.Background(), dir, name)
		if err == nil {
			return dir, stop
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s in %s does not answer a minute on: %v", name, dir, err)
		}
	}
}
