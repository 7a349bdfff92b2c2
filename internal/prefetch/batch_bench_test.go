package prefetch

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// BenchmarkPrefetchThenLoad measures what prefetching hides: each
// operation takes the next 16 lines of a random order over 20,000 lines,
// either next to each other (stride=64) or one per 4 KiB page
// (stride=4096), prefetches them (prefetch=true) or not, optionally does
// about 2.5 µs of unrelated work (wait=true), then loads them one after
// another, each load's address depending on the one before. ns/op less
// the same with stride=64 is what the distinct pages cost; with wait, a
// prefetch issued that long before its load has had time to walk the page
// table and bring the line, and the difference shows whether it did.
func BenchmarkPrefetchThenLoad(b *testing.B) {
	const page, n, k = 4096, 20000, 16
	for _, wait := range []bool{false, true} {
		for _, stride := range []int{Line, page} {
			for _, pf := range []bool{false, true} {
				b.Run(fmt.Sprintf("wait=%v/stride=%d/prefetch=%v", wait, stride, pf), func(b *testing.B) {
					mem := make([]byte, n*stride)
					// Write every page before the timing: a page only
					// read would be faulted in inside the timed loop
					// (20,000 faults for stride=4096), or, where the
					// kernel maps the shared zero page on a read fault
					// (Linux unless it is disabled), be that one
					// physical page, so that every line of stride=4096
					// is the same cache line and those of stride=64 64.
					for i := 0; i < len(mem); i += page {
						mem[i] = 0
					}
					order := rand.New(rand.NewPCG(1, n)).Perm(n)
					base := uintptr(unsafe.Pointer(&mem[0]))
					offs, addrs := make([]int, k), make([]uintptr, k)
					var sink uintptr
					j := 0
					for b.Loop() {
						for i := range addrs {
							offs[i] = order[j] * stride
							addrs[i] = base + uintptr(offs[i])
							j = (j + 1) % n
						}
						if pf {
							Addrs(addrs)
						}
						if wait {
							x := sink
							for range 3000 {
								x = x*7 + 1
							}
							sink = x
						}
						v := 0 // always 0, which the compiler cannot know
						for _, o := range offs {
							v = int(mem[o+v])
						}
						sink += uintptr(v)
					}
					if sink == 42 {
						b.Log(sink) // keeps sink live
					}
				})
			}
		}
	}
}
