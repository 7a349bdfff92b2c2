package mlx4

import (
	"testing"
	"unsafe"
)

// TestQPLayout checks that posting a send, inline or not, reads two cache
// lines of a QP object, the verbs QP's ops among them: with thousands of
// QPs, each line is a cache miss on every post.
func TestQPLayout(t *testing.T) {
	var q QP
	end := func(p unsafe.Pointer, n uintptr) uintptr { return uintptr(p) + n - uintptr(unsafe.Pointer(&q)) }
	hot := []uintptr{ // the end of each field PostSend reads, as an offset
		end(unsafe.Pointer(&q.sqMu), unsafe.Sizeof(q.sqMu)),
		end(unsafe.Pointer(&q.sq), unsafe.Sizeof(q.sq)),
		end(unsafe.Pointer(&q.ctx), unsafe.Sizeof(q.ctx)),
		end(unsafe.Pointer(&q.qpn), unsafe.Sizeof(q.qpn)),
		end(unsafe.Pointer(&q.sigAll), unsafe.Sizeof(q.sigAll)),
		end(unsafe.Pointer(&q.spare), unsafe.Sizeof(q.spare)),
		end(unsafe.Pointer(&q.typ), unsafe.Sizeof(q.typ)),
		end(unsafe.Pointer(&q.maxInline), unsafe.Sizeof(q.maxInline)), // inline posts
		// verbs.QP.PostSend reads ops, its first field (an interface;
		// verbs' TestQPOpsFirst checks that it is first).
		end(unsafe.Pointer(&q.home), 2*unsafe.Sizeof(uintptr(0))),
	}
	const lines = 2 * 64
	for i, e := range hot {
		if e > lines {
			t.Errorf("field %d of those posting reads ends %d bytes into the QP, past its first two lines", i, e)
		}
	}
	// Go puts objects of QP's size class on 64-byte boundaries (they have
	// no allocation header below 512 bytes), so the first two lines of
	// the object are two cache lines.
	if n := unsafe.Sizeof(q); n > 512 {
		t.Errorf("QP takes %d bytes: Go gives it an allocation header, which moves it off the line", n)
	}
	for range 16 {
		escapedQP = new(QP)
		if p := uintptr(unsafe.Pointer(escapedQP)); p%64 != 0 {
			t.Fatalf("a QP at %#x, %d bytes into a cache line", p, p%64)
		}
	}
}

var escapedQP *QP // a QP on the heap
