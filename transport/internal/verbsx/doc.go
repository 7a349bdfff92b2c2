// Package verbsx holds what the verbs transports (transport/rc and
// transport/xrc) share: the SRQ's eager receive buffers and their refill,
// registered send buffers, credit accounting, the registration cache,
// RDMA READ splitting and bookkeeping, the Remote format, the goroutines
// that wait for completion and async events, the common counters and the
// queue-size estimate of Stats.
//
// # Memory
//
// A buffer posted to the device (a receive buffer on the SRQ, a send
// buffer of a send in flight, the destination of an RDMA READ) belongs to
// the device from the post until its completion is polled. The pools own
// their memory (allocated outside the Go heap with verbs.Alloc) and free
// it at Close. Buffers given to the registration cache belong to the
// caller, who keeps them alive and unmoved while an entry covering them is
// in use; the cache may keep them registered (pinned) longer, until the
// entry is dropped.
//
// # Goroutines
//
// Everything here is owned by the goroutine that drives the transport,
// except RecvPool's posting (also done by the async event goroutine on an
// SRQ limit event; guarded by its mutex) and the functions that run as
// goroutines of their own (WatchCQ, WatchEvents).
package verbsx
