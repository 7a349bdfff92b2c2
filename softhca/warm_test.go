//go:build linux

package softhca

import (
	"slices"
	"testing"
)

// TestWarmLinesMatchFieldAddresses: the line addresses computed with
// unsafe.Offsetof are those of the fields themselves.
func TestWarmLinesMatchFieldAddresses(t *testing.T) {
	q := &qp{}
	got := q.requesterLines(nil)
	want := append([]uintptr{addr(q)}, appendLines(nil, addr(&q.scq), addr(&q.req.heapAt)+unsafeSize(q.req.heapAt))...)
	if !slices.Equal(got, want) {
		t.Errorf("requesterLines %x, want %x", got, want)
	}
	for _, x := range []bool{false, true} {
		got := q.responderLines(nil, x)
		want := append([]uintptr{addr(q)}, appendLines(nil, addr(&q.rcq), addr(&q.resp.recvSG1)+unsafeSize(q.resp.recvSG1))...)
		if x {
			want = appendLines(want, addr(&q.resp.xsrq), addr(&q.resp.xsrq)+unsafeSize(q.resp.xsrq))
		}
		if !slices.Equal(got, want) {
			t.Errorf("responderLines(%v) %x, want %x", x, got, want)
		}
	}
}
