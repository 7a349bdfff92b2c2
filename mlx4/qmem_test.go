//go:build linux

package mlx4

import (
	"errors"
	"math/rand/v2"
	"sync"
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

// alignedKernel hands out heap memory aligned to unix.PageSize, whatever
// that is set to, so that queueMem can be tried with pages other than the
// machine's.
type alignedKernel struct {
	Kernel
	mu   sync.Mutex
	live map[uintptr][]byte
}

func (k *alignedKernel) AllocQueue(n int) ([]byte, error) {
	ps := unix.PageSize
	raw := make([]byte, n+ps)
	off := (ps - int(addrOf(raw)%uintptr(ps))) % ps
	b := raw[off : off+n : off+n]
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.live == nil {
		k.live = map[uintptr][]byte{}
	}
	k.live[addrOf(b)] = raw
	return b, nil
}

func (k *alignedKernel) FreeQueue(b []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.live[addrOf(b)]; !ok {
		return unix.Error(unix.EINVAL, "not allocated")
	}
	delete(k.live, addrOf(b))
	return nil
}

// exercise allocates and frees buffers of random sizes, small and whole
// pages, checking alignment, zeroing and overlap, and that everything goes
// back at the end.
func exercise(t *testing.T, m *queueMem, rng *rand.Rand, rounds int, mu *sync.Mutex) {
	t.Helper()
	type buf struct {
		b   []byte
		tag byte
	}
	var live []buf
	ps := unix.PageSize
	for round := range rounds {
		if len(live) > 0 && (len(live) > 300 || rng.IntN(3) == 0) {
			i := rng.IntN(len(live))
			x := live[i]
			for j, v := range x.b[:cap(x.b)] {
				if v != x.tag {
					t.Errorf("round %d: byte %d of a %d-byte buffer is %#x, written %#x: overlap", round, j, cap(x.b), v, x.tag)
					return
				}
			}
			if err := m.free(x.b); err != nil {
				t.Error(err)
				return
			}
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			continue
		}
		n := 1 + rng.IntN(maxSmall)
		if rng.IntN(10) == 0 {
			n = maxSmall + 1 + rng.IntN(2*ps)
		}
		b, err := m.alloc(n)
		if err != nil {
			t.Error(err)
			return
		}
		align := ps
		if n <= maxSmall && 2*maxSmall <= ps {
			align = minSmall
			for align < n {
				align *= 2
			}
		}
		if len(b) != n || cap(b)%align != 0 || addrOf(b)%uintptr(align) != 0 {
			t.Errorf("buffer of %d bytes: len %d cap %d at %#x, want aligned to %d", n, len(b), cap(b), addrOf(b), align)
			return
		}
		for j, v := range b[:cap(b)] {
			if v != 0 {
				t.Errorf("buffer of %d bytes: byte %d is %#x, not zeroed", n, j, v)
				return
			}
		}
		tag := byte(1 + rng.IntN(250))
		for j := range cap(b) {
			b[:cap(b)][j] = tag
		}
		live = append(live, buf{b, tag})
	}
	for _, l := range live {
		if err := m.free(l.b); err != nil {
			t.Error(err)
		}
	}
}

// TestQueueMemPackedPageSizes: packed queue memory with 16 KiB and 64 KiB
// pages (arm64, ppc64le).
func TestQueueMemPackedPageSizes(t *testing.T) {
	saved := unix.PageSize
	defer func() { unix.PageSize = saved }()
	for _, ps := range []int{4096, 16384, 65536} {
		unix.PageSize = ps
		k := &alignedKernel{}
		m := &queueMem{k: k, packed: true}
		exercise(t, m, rand.New(rand.NewPCG(uint64(ps), 1)), 5000, nil)
		if len(m.small) != 0 {
			t.Errorf("page size %d: %d small pages left", ps, len(m.small))
		}
		if err := m.close(); err != nil || len(k.live) != 0 {
			t.Errorf("page size %d: close: %v, %d allocations live", ps, err, len(k.live))
		}
	}
}

// TestQueueMemPackedConcurrent: goroutines allocating and freeing at once
// (run with -race).
func TestQueueMemPackedConcurrent(t *testing.T) {
	k := &alignedKernel{}
	m := &queueMem{k: k, packed: true}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			exercise(t, m, rand.New(rand.NewPCG(uint64(g), 7)), 3000, nil)
		}()
	}
	wg.Wait()
	if len(m.small) != 0 {
		t.Errorf("%d small pages left", len(m.small))
	}
	for c, p := range m.partial {
		if len(p) != 0 {
			t.Errorf("class %d: %d pages listed partial", c, len(p))
		}
	}
	if err := m.close(); err != nil || len(k.live) != 0 {
		t.Errorf("close: %v, %d allocations live", err, len(k.live))
	}
}

// TestQueueMemPackedBadFrees: frees that are not of a buffer in use are
// refused with EINVAL and change nothing.
func TestQueueMemPackedBadFrees(t *testing.T) {
	k := &alignedKernel{}
	m := &queueMem{k: k, packed: true}
	a, _ := m.alloc(100) // 128-byte class
	b, _ := m.alloc(100)
	pg, _ := m.alloc(3 * maxSmall)
	for _, bad := range [][]byte{
		a[1:], a[:0:64], b[: 0 : cap(b)-64], pg[:0:maxSmall], pg[maxSmall:], a[:0:0],
	} {
		if err := m.free(bad); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("free of %d bytes at %#x: %v, want EINVAL", cap(bad), addrOf(bad), err)
		}
	}
	for i := range a {
		a[i] = 7
	}
	if err := m.free(b); err != nil {
		t.Fatal(err)
	}
	if err := m.free(b); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("double free: %v", err)
	}
	c, _ := m.alloc(128)
	if addrOf(c) == addrOf(a) {
		t.Fatal("a live buffer handed out again")
	}
	for _, v := range a {
		if v != 7 {
			t.Fatal("a live buffer changed")
		}
	}
	for _, x := range [][]byte{a, c, pg} {
		if err := m.free(x); err != nil {
			t.Fatal(err)
		}
	}
	if len(m.small) != 0 {
		t.Errorf("%d small pages left", len(m.small))
	}
	if err := m.close(); err != nil || len(k.live) != 0 {
		t.Errorf("close: %v, %d live", err, len(k.live))
	}
}
