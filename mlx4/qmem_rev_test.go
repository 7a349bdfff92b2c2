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
