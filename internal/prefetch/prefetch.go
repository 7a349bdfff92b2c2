// Package prefetch asks the CPU to start loading cache lines that code is
// about to read, so that the misses on many of them overlap instead of
// coming one at a time.
//
// The data path of the software HCA touches, per message, the state of a
// QP that with thousands of QPs has usually left the CPU's caches. A round
// of the engine handles a batch of messages: prefetching the lines of all
// their QPs first lets the memory system fetch them in parallel, as a
// hardware adapter prefetches the QP contexts its doorbells name.
//
// A prefetch is only a hint: it never faults and never changes what a
// program computes, so an address may be stale or wrong at the cost of a
// wasted load. On architectures without an implementation here, Addrs does
// nothing.
package prefetch

// Line is the cache line size the package assumes.
const Line = 64
