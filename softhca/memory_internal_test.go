package softhca

import (
	"unsafe"

	"github.com/xrcrun/xrc/internal/mlx4hw"
)

// ReachMemoryThroughProcess makes the device reach the memory regions of
// the clients it connects from now on in this process with
// process_vm_readv/writev, as it reaches Go memory in other processes, so
// that in-process tests cover that path.
func (d *Device) ReachMemoryThroughProcess() { d.noViews = true }

// QPBytes is the Go heap the device holds for its QPs, per QP: each qp
// object and the buffers and WQE records it owns (capacities, not
// lengths), the device's QP table, and the engine's free WQE records. The
// clients' handle maps are not counted. For BenchmarkQPScaling.
func (d *Device) QPBytes() float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	total, n := 0, 0
	for q := range d.qps.all {
		n++
		total += q.heapBytes()
	}
	if n == 0 {
		return 0
	}
	total += d.qps.bytes() + cap(d.eng.wqes.free)*int(unsafe.Sizeof((*swqe)(nil)))
	for _, w := range d.eng.wqes.free {
		total += swqeBytes(w)
	}
	return float64(total) / float64(n)
}

// heapBytes counts a QP's object and what it owns.
func (q *qp) heapBytes() int {
	const ptr = int(unsafe.Sizeof(uintptr(0)))
	n := int(unsafe.Sizeof(*q))
	r := &q.req
	n += cap(r.qbuf) * ptr
	for _, w := range r.q {
		n += swqeBytes(w)
	}
	s := &q.resp
	if cap(s.recvSG) > 0 && unsafe.SliceData(s.recvSG) != &s.recvSG1[0] {
		n += cap(s.recvSG) * int(unsafe.Sizeof(lsge{}))
	}
	n += cap(s.readBuf)*ptr + cap(s.res)*int(unsafe.Sizeof(resource{}))
	return n
}

func swqeBytes(w *swqe) int {
	return int(unsafe.Sizeof(*w)) + cap(w.w.SG)*int(unsafe.Sizeof(mlx4hw.DataSeg{})) +
		cap(w.w.Inline) + cap(w.sg)*int(unsafe.Sizeof(lsge{}))
}
