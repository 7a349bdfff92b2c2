// Package verbsx holds what the verbs transports (transport/rc and
// transport/xrc) share. They differ in how their QPs connect: RC has one
// QP per remote rank, XRC one INI QP per remote node, shared by its ranks,
// with the destination's SRQ number in every work request, and TGT QPs
// that tell the senders apart. The rest is here:
//
//   - Endpoint (endpoint.go): the transport.Transport methods that do not
//     depend on the connection type (TrySend, Read, Expose, Unexpose,
//     Progress, Reaches, MaxEager) over Conns (a send QP and the work
//     queued on it: RC's QP, XRC's INI QP) and Peers (a remote rank, its
//     Conn, its SRQ number, its credits) and failing a Conn, which fails
//     its Peers, or a Peer alone (conn.go); the QP error events, and the
//     report of failed Peers to a transport.PeerFailureHandler;
//     completions and the Conns and Peers with work left for Progress
//     (progress.go), sends and credit messages (send.go), reads
//     (read.go), making and connecting a Conn's QP (connect.go, qp.go),
//     and the goroutines. A transport makes its Conns and Peers, tells the
//     Endpoint which QP numbers complete whose frames (Receives), and
//     connects lazily through a Connector of its own.
//   - Core (core.go): the port, PD, completion channel and CQ, the SRQ's
//     eager receive buffers and their refill (buffers.go), the registered
//     send buffers and the framing of a SEND (frame.go), the registration
//     cache (regcache.go), RDMA READ splitting and bookkeeping (reads.go).
//   - Credit accounting (credits.go), work request ids (wrid.go), the
//     Remote format (remote.go), the header of the records (record.go),
//     the lazy-connection mailbox (mailbox.go), the goroutines that wait
//     for completion and async events (events.go), the common counters
//     (metrics.go) and the queue-size estimate of Stats.
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
// entry is dropped or verbs.Free unmaps the memory (RegCache hooks it).
//
// # Goroutines
//
// Everything here is owned by the goroutine that drives the transport,
// except RecvPool's posting (also done by the async event goroutine on an
// SRQ limit event; guarded by its mutex), the RegCache (whose verbs.Free
// hook runs on the goroutine calling Free; guarded by its mutex), the
// Mailbox (safe for concurrent use) and the functions that run as goroutines of their own (WatchCQ,
// WatchEvents, which Endpoint.Run starts, and what the transport starts
// with Endpoint.Go). Endpoint.Close stops them all.
package verbsx
