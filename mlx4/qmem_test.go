//go:build linux

package mlx4

import (
	"errors"
	"math/rand/v2"
	"syscall"
	"testing"

	"github.com/xrcrun/xrc/internal/unix"
)

// countingKernel maps queue memory and counts what it has handed out.
type countingKernel struct {
	Kernel
	allocs, live int
}

func (k *countingKernel) AllocQueue(n int) ([]byte, error) {
	k.allocs++
	k.live++
	return unix.MmapAnon(n)
}

func (k *countingKernel) FreeQueue(b []byte) error {
	k.live--
	return unix.Munmap(b)
}

// TestQueueMemShares: a thousand small queue buffers take a few of the
// Kernel's allocations, each is page-aligned and zeroed (also when its
// pages held an earlier buffer: a buffer overlapping a live one would not
// be, and the live one's bytes would change), a large buffer is
// an allocation of its own, and once all are freed one chunk is left, which
// close gives back.
func TestQueueMemShares(t *testing.T) {
	k := &countingKernel{}
	m := &queueMem{k: k}
	rng := rand.New(rand.NewPCG(1, 2))
	type buf struct {
		b   []byte
		tag byte
	}
	var live []buf
	check := func(b []byte, n int) {
		t.Helper()
		if len(b) != n || cap(b)%unix.PageSize != 0 || addrOf(b)%uintptr(unix.PageSize) != 0 {
			t.Fatalf("buffer of %d bytes: len %d cap %d at %#x", n, len(b), cap(b), addrOf(b))
		}
		for i, v := range b[:cap(b)] {
			if v != 0 {
				t.Fatalf("buffer of %d bytes: byte %d is %#x, not zeroed", n, i, v)
			}
		}
	}
	for round := range 4000 {
		if len(live) > 0 && (len(live) > 1000 || rng.IntN(3) == 0) {
			i := rng.IntN(len(live))
			x := live[i]
			for j, v := range x.b[:cap(x.b)] {
				if v != x.tag {
					t.Fatalf("round %d: byte %d of a buffer is %#x, written %#x: another buffer overlaps it", round, j, v, x.tag)
				}
			}
			if err := m.free(x.b); err != nil {
				t.Fatal(err)
			}
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			continue
		}
		n := 1 + rng.IntN(4*unix.PageSize)
		b, err := m.alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		check(b, n)
		tag := byte(1 + round%250)
		for j := range cap(b) {
			b[:cap(b)][j] = tag
		}
		live = append(live, buf{b, tag})
	}
	if k.allocs > 20 {
		t.Errorf("%d allocations of the Kernel for at most 1,000 buffers of up to 4 pages, want a few chunks", k.allocs)
	}

	big, err := m.alloc((maxPooledPages + 1) * unix.PageSize)
	if err != nil {
		t.Fatal(err)
	}
	if _, c := m.chunkOf(addrOf(big)); c != nil {
		t.Error("a buffer larger than maxPooledPages came from a chunk")
	}
	before := k.live
	if err := m.free(big); err != nil || k.live != before-1 {
		t.Fatalf("free of a large buffer: %v, %d allocations live, want %d", err, k.live, before-1)
	}

	for _, x := range live {
		if err := m.free(x.b); err != nil {
			t.Fatal(err)
		}
	}
	if k.live != 1 || len(m.chunks) != 1 {
		t.Fatalf("all freed: %d allocations live, %d chunks, want 1", k.live, len(m.chunks))
	}
	b, err := m.alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	check(b, 100)
	if err := m.free(b); err != nil {
		t.Fatal(err)
	}
	if err := m.close(); err != nil || k.live != 0 {
		t.Fatalf("close: %v, %d allocations live", err, k.live)
	}
}

// TestQueueMemBadFree: freeing what is not a buffer in use (twice, a part
// of one) is refused and changes nothing.
func TestQueueMemBadFree(t *testing.T) {
	k := &countingKernel{}
	m := &queueMem{k: k}
	a, err := m.alloc(3 * unix.PageSize)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.alloc(10)
	if err != nil {
		t.Fatal(err)
	}
	a[0], b[0] = 1, 2
	for _, bad := range [][]byte{a[unix.PageSize:], a[:unix.PageSize:unix.PageSize], a[8:]} {
		if err := m.free(bad); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("free of part of a buffer: %v, want EINVAL", err)
		}
	}
	if err := m.free(b); err != nil {
		t.Fatal(err)
	}
	if err := m.free(b); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("second free: %v, want EINVAL", err)
	}
	if a[0] != 1 {
		t.Error("a refused free cleared a buffer in use")
	}
	if err := m.close(); err != nil || k.live != 1 {
		t.Fatalf("close with a buffer in use: %v, %d allocations live, want its chunk kept", err, k.live)
	}
}

// TestQueueMemNoThrashWhenFull: every chunk is full of live queues (a
// client with many QPs), and the program creates and destroys one more
// queue in a loop (a connection that comes and goes). Each create should
// not cost a new 1 MiB chunk from the Kernel (with a software HCA in
// another process: a memfd, a message and a mapping on both sides, and
// 1 MiB zeroed), freed again by the destroy.
func TestQueueMemNoThrashWhenFull(t *testing.T) {
	k := &countingKernel{}
	m := &queueMem{k: k}
	for range chunkPages { // one chunk, full
		if _, err := m.alloc(unix.PageSize); err != nil {
			t.Fatal(err)
		}
	}
	before := k.allocs
	for range 10 {
		b, err := m.alloc(2 * unix.PageSize)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.free(b); err != nil {
			t.Fatal(err)
		}
	}
	if n := k.allocs - before; n > 1 {
		t.Errorf("10 create/destroy cycles of a 2-page queue took %d chunks of %d KiB from the Kernel, want at most 1", n, chunkPages*unix.PageSize>>10)
	}
}

// TestQueueMemPacked: with a device that takes packed queues, buffers of up
// to maxSmall bytes share pages with buffers of their size class: each is
// aligned to its class, zeroed (also where an earlier buffer was), never
// overlaps another, and a thousand take a few pages; a bad free is refused
// and changes nothing; when all are freed, their pages go back.
func TestQueueMemPacked(t *testing.T) {
	k := &countingKernel{}
	m := &queueMem{k: k, packed: true}
	rng := rand.New(rand.NewPCG(3, 4))
	type buf struct {
		b   []byte
		tag byte
	}
	var live []buf
	maxPages := 0
	for round := range 6000 {
		if len(live) > 0 && (len(live) > 1000 || rng.IntN(3) == 0) {
			i := rng.IntN(len(live))
			x := live[i]
			for j, v := range x.b[:cap(x.b)] {
				if v != x.tag {
					t.Fatalf("round %d: byte %d of a buffer is %#x, written %#x: another buffer overlaps it", round, j, v, x.tag)
				}
			}
			if err := m.free(x.b); err != nil {
				t.Fatal(err)
			}
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			continue
		}
		n := 1 + rng.IntN(maxSmall)
		if rng.IntN(20) == 0 {
			n = maxSmall + 1 + rng.IntN(2*unix.PageSize) // whole pages, beside the small ones
		}
		b, err := m.alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		align := unix.PageSize
		if n <= maxSmall {
			align = minSmall
			for align < n {
				align *= 2
			}
		}
		if len(b) != n || cap(b)%align != 0 || addrOf(b)%uintptr(align) != 0 {
			t.Fatalf("buffer of %d bytes: len %d cap %d at %#x, want aligned to %d", n, len(b), cap(b), addrOf(b), align)
		}
		for j, v := range b[:cap(b)] {
			if v != 0 {
				t.Fatalf("buffer of %d bytes: byte %d is %#x, not zeroed", n, j, v)
			}
		}
		tag := byte(1 + round%250)
		for j := range cap(b) {
			b[:cap(b)][j] = tag
		}
		live = append(live, buf{b, tag})
		maxPages = max(maxPages, len(m.small))
	}
	if maxPages > 1000*maxSmall/unix.PageSize {
		t.Errorf("%d small pages for at most 1,000 buffers of up to %d bytes", maxPages, maxSmall)
	}
	var x []byte
	for _, l := range live {
		if cap(l.b) < unix.PageSize {
			x = l.b
			break
		}
	}
	if x == nil {
		t.Fatal("no small buffer left live")
	}
	for _, bad := range [][]byte{x[minSmall/2:], x[: 0 : cap(x)/2]} {
		if err := m.free(bad); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("free of part of a %d-byte buffer (cap %d): %v, want EINVAL", cap(x), cap(bad), err)
		}
	}
	for _, l := range live {
		if err := m.free(l.b); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.free(x); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("second free of a small buffer: %v, want EINVAL", err)
	}
	if len(m.small) != 0 || k.live != 1 {
		t.Fatalf("all freed: %d small pages, %d allocations of the Kernel live, want 0 and 1", len(m.small), k.live)
	}
	for _, p := range m.partial {
		if len(p) != 0 {
			t.Fatalf("all freed: %d small pages still listed with a buffer free", len(p))
		}
	}
	if err := m.close(); err != nil || k.live != 0 {
		t.Fatalf("close: %v, %d allocations live", err, k.live)
	}
}
