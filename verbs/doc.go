// Package verbs is an idiomatic Go API for RDMA verbs: devices, protection
// domains, memory regions, completion queues and channels, shared receive
// queues, queue pairs, work requests and completions, and async events. It
// is pure Go; devices are reached through providers that speak the kernel's
// uverbs ABI (package mlx4), to real HCAs or to software HCAs (package
// softhca).
//
// # Quick start
//
//	import (
//		"github.com/xrcrun/xrc/verbs"
//		_ "github.com/xrcrun/xrc/mlx4"    // ConnectX-3 class HCAs
//		_ "github.com/xrcrun/xrc/softhca" // software HCAs
//	)
//
//	ctx, err := verbs.Open(context.Background(), "", verbs.Config{}) // the first device
//	pd, err := ctx.AllocPD()
//	buf, err := verbs.Alloc(1 << 20)
//	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
//	cq, err := ctx.CreateCQ(256, nil, 0)
//	qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: cq, RecvCQ: cq,
//		Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}})
//	// Exchange qp.Num(), the port's GID and a PSN with the peer, then
//	// Modify through INIT, RTR and RTS, post work requests and Poll.
//
// # Control path and data path
//
// Creating, modifying and destroying objects goes to the device and may
// block. PostSend, PostRecv, Poll and RequestNotify do not: they write queue
// entries and doorbells in memory shared with the device and allocate
// nothing, so a WorkCompletion slice passed to Poll is reused as it is.
//
// # Memory
//
// The memory a work request names belongs to the device from the post until
// the request's completion is polled (for unsignaled sends, until a later
// send's completion is polled). Register memory from Alloc, which lives
// outside the Go heap, or any Go slice, which RegMR pins until the region
// is closed. Free refuses memory that is still registered.
//
// # Resource cleanup
//
// Every object has a Close. Closing a parent with live children fails with
// an error wrapping syscall.EBUSY, as the kernel does: close QPs before the
// CQs, SRQs and PD they use, memory regions before their PD, CQs before
// their completion channel, and everything before the Context.
//
// # Thread safety
//
// Objects are safe for concurrent use. Posting to one queue from several
// goroutines is serialized by the provider; a CompChannel and a Context's
// async events are meant to have one waiter at a time.
//
// # XRC
//
// Where the device has it (Context.Supports(FeatureXRC)), XRC lets one send
// QP per remote node reach every process there: OpenXRCD opens a domain
// shared through a file, PD.CreateXRCSRQ makes a process's receive queue in
// it, XRCD.CreateTgtQP and XRCD.OpenQP make and share the receive QPs,
// CreateQP with QPTXRCIni the send QPs, and SendWR.RemoteSRQNum picks the
// receiving SRQ. See xrc.go.
//
// # Errors
//
// Errors wrap the errno the device returned; match them with errors.Is
// (syscall.EINVAL, syscall.EBUSY, ...). A QP transition the IB state machine
// does not allow is a *TransitionError naming the missing or unexpected
// attributes. An optional capability the device lacks is an error matching
// ErrNotSupported, decided by Context.Supports from the device's capability
// bits. A failed post is a *PostError naming the first request not posted.
package verbs
