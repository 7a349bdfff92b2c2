package softhca

import (
	"testing"
	"unsafe"

	"github.com/xrcrun/xrc/internal/prefetch"
)

// TestQPLayout checks the cache lines qp's doc comment promises, which
// warm prefetches: a requester reads 4 lines of a QP per message, the
// responder of an RC QP on an SRQ 3. Go starts a qp object on a cache
// line, or 8 bytes after one (where an allocation header comes first);
// both must hold.
func TestQPLayout(t *testing.T) {
	var q qp
	off := func(p unsafe.Pointer) uintptr { return uintptr(p) - uintptr(unsafe.Pointer(&q)) }
	type span struct{ from, to uintptr } // object offsets
	req := []span{
		{0, off(unsafe.Pointer(&q.client)) + unsafe.Sizeof(q.client)},
		{off(unsafe.Pointer(&q.scq)), off(unsafe.Pointer(&q.req)) + unsafe.Sizeof(q.req)},
	}
	resp := []span{
		{0, off(unsafe.Pointer(&q.client)) + unsafe.Sizeof(q.client)},
		{off(unsafe.Pointer(&q.rcq)), off(unsafe.Pointer(&q.resp.recvSG1)) + unsafe.Sizeof(q.resp.recvSG1)},
	}
	lines := func(spans []span, shift uintptr) int {
		m := map[uintptr]bool{}
		for _, s := range spans {
			for l := (s.from + shift) / prefetch.Line; l <= (s.to+shift-1)/prefetch.Line; l++ {
				m[l] = true
			}
		}
		return len(m)
	}
	for _, shift := range []uintptr{0, 8} {
		if n := lines(req, shift); n > 4 {
			t.Errorf("object %d bytes into a line: the requester reads %d lines, want 4", shift, n)
		}
		if n := lines(resp, shift); n > 3 {
			t.Errorf("object %d bytes into a line: the responder reads %d lines, want 3", shift, n)
		}
	}

	// What warm prefetches for a QP on the heap.
	h := new(qp)
	escapedQP = h
	if n := len(h.requesterLines(nil)); n > 4 {
		t.Errorf("warm prefetches %d lines for the requester, want 4", n)
	}
	if n := len(h.responderLines(nil, false)); n > 3 {
		t.Errorf("warm prefetches %d lines for the responder, want 3", n)
	}
}

var escapedQP *qp
