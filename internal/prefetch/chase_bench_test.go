package prefetch

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// BenchmarkChase measures what a cache line costs to load when it was last
// touched thousands of other lines ago, as a QP's state is with thousands
// of QPs: n lines are visited in a random cycle, each load waiting for the
// one before (a pointer chase, so no two overlap). The lines are either
// next to each other (dense) or one per 4 KiB page, at the same offset in
// each (sparse) or at offsets spread over the page (sparse-staggered), so
// that the difference is what the distinct pages cost: TLB misses, which in
// a virtual machine whose memory the host maps in 4 KiB pages are nested
// page walks whatever page size the guest uses. ns/op is one load.
//
// The counts find the two reaches that decide what a QP's state costs: the
// TLB's, where the sparse variants turn up (on this machine between 4,000
// and 8,000 pages), and the last-level cache's, where the dense one does
// (between 100,000 and 200,000 lines, 6.4 and 12.8 MB). The sparse variants
// stop at 20,000 pages (80 MB).
func BenchmarkChase(b *testing.B) {
	const page = 4096
	for _, n := range []int{1000, 4000, 8000, 20000, 100000, 200000} {
		for _, v := range []struct {
			name            string
			stride, stagger int // in bytes
		}{{"dense", Line, 0}, {"sparse", page, 0}, {"sparse-staggered", page, Line}} {
			if v.stride == page && n > 20000 {
				continue
			}
			b.Run(fmt.Sprintf("lines=%d/%s", n, v.name), func(b *testing.B) {
				const word = 4
				mem := make([]uint32, (n*v.stride+page)/word)
				skip := int(uintptr(unsafe.Pointer(&mem[0]))%page) / word // to a page boundary
				mem = mem[(page/word-skip)%(page/word):]
				at := func(i int) uint32 { return uint32((i*v.stride + i%(page/Line)*v.stagger) / word) }
				order := rand.New(rand.NewPCG(1, uint64(n))).Perm(n)
				for i, l := range order {
					mem[at(l)] = at(order[(i+1)%n])
				}
				p := at(order[0])
				for range n { // once round first, so that no page faults in while measured
					p = mem[p]
				}
				for b.Loop() {
					p = mem[p]
				}
				if p == 0 && order[0] != 0 {
					b.Log(p) // keeps p live
				}
			})
		}
	}
}
