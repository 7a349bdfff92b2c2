//go:build linux

package softhca

import (
	"unsafe"

	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/prefetch"
)

// warm prefetches, for every send doorbell and packet a round is about to
// process, the cache lines of its QP the processing reads, before it
// processes any of them.
//
// With thousands of QPs most QP objects have left the CPU's caches, and a
// message costs several cache misses on its QP. Processed one message
// after another, those misses come one at a time; prefetched together, the
// misses of the whole batch are outstanding at once, as a hardware adapter
// prefetches the contexts of the QPs its doorbells name. It goes in two
// steps: the lines of the QP objects, then what those lines point to (the
// next send queue slot, the oldest outstanding WQE's record), whose
// addresses are known only once the first lines have come.
//
// The addresses go in e.warmAddrs and the QPs in e.warmQPs, scratch space
// the engine owns; a prefetch is only a hint, so nothing here changes what
// the round computes. Caller holds d.mu.
func (e *engine) warm() {
	if len(e.bellWork)+len(e.rxWork) < 2 || e.d.qps.len() < warmMinQPs {
		return // nothing to overlap, or the QPs' state stays in the caches
	}
	t := &e.d.qps
	a, qs := e.warmAddrs[:0], e.warmQPs[:0]
	for i := range e.bellWork {
		b := &e.bellWork[i]
		if b.off != mlx4hw.UARSendDoorbell {
			continue
		}
		if q := t.getIndex(uint32(b.v) >> 8 & qpnIndex); q != nil {
			a = q.requesterLines(a)
			qs = append(qs, warmQP{q, true})
		}
	}
	for _, p := range e.rxWork {
		q := t.getIndex(p.DestQP & qpnIndex)
		switch {
		case q == nil:
		case p.Opcode.IsResponse():
			a = q.requesterLines(a)
			qs = append(qs, warmQP{q, false})
		default:
			a = q.responderLines(a, p.Opcode.HasXRCETH())
		}
	}
	prefetch.Addrs(a)
	a = a[:0]
	for _, w := range qs {
		q, r := w.q, &w.q.req
		if w.bell && len(q.sq.buf) > 0 {
			// After the WQE just posted the device reads the owner
			// word of the slot after it, to find nothing more was
			// posted: a slot the client last wrote a turn of the
			// ring ago.
			a = append(a, uintptr(unsafe.Pointer(&q.sq.slot(r.head + 1)[0])))
		}
		if len(r.q) > 0 {
			a = append(a, uintptr(unsafe.Pointer(r.q[0])))
		} else if w.bell && cap(r.q) > 0 {
			// The record of the WQE about to be fetched goes in r.q's
			// array, an allocation of the QP's own.
			a = append(a, uintptr(unsafe.Pointer(unsafe.SliceData(r.q))))
		}
	}
	prefetch.Addrs(a)
	clear(qs)
	e.warmAddrs, e.warmQPs = a[:0], qs[:0]
}

// warmMinQPs is the number of QPs below which warm does nothing: the
// state of a few hundred QPs stays in the CPU's caches, and prefetching
// it costs a round more than it saves (about 30 ns a message with 10 QPs
// in BenchmarkQPScaling).
const warmMinQPs = 256

// warmQP is a QP whose requester a round will run, for a doorbell (bell)
// or for an acknowledgement.
type warmQP struct {
	q    *qp
	bell bool
}

// requesterLines appends the addresses of the cache lines of q that the
// requester reads for a message: the first line, and from the send CQ to
// the last of the requester's state a message uses.
//
// The addresses are computed from q's without dereferencing it: a nil
// check on q (which Go does by touching it, where a call is not inlined)
// would wait for the very line this is to prefetch.
func (q *qp) requesterLines(a []uintptr) []uintptr {
	base := addr(q)
	a = append(a, base)
	return appendLines(a, base+unsafe.Offsetof(q.scq),
		base+unsafe.Offsetof(q.req)+unsafe.Offsetof(q.req.heapAt)+unsafe.Sizeof(q.req.heapAt))
}

// responderLines appends the addresses of the cache lines of q that the
// responder reads for a request: the first line, and the receive side's
// state up to the scatter list of a receive; for an XRC request (xrc) also
// the line of the message's XRC SRQ.
// As requesterLines, it does not dereference q.
func (q *qp) responderLines(a []uintptr, xrc bool) []uintptr {
	base := addr(q)
	resp := base + unsafe.Offsetof(q.resp)
	a = append(a, base)
	a = appendLines(a, base+unsafe.Offsetof(q.rcq), resp+unsafe.Offsetof(q.resp.recvSG1)+unsafe.Sizeof(q.resp.recvSG1))
	if xrc {
		x := resp + unsafe.Offsetof(q.resp.xsrq)
		a = appendLines(a, x, x+unsafe.Sizeof(q.resp.xsrq))
	}
	return a
}

// appendLines appends the address of every cache line in [from, to).
func appendLines(a []uintptr, from, to uintptr) []uintptr {
	for l := from &^ (prefetch.Line - 1); l < to; l += prefetch.Line {
		a = append(a, l)
	}
	return a
}

func addr[T any](p *T) uintptr { return uintptr(unsafe.Pointer(p)) }
