//go:build linux

package softhca

import (
	"bytes"
	"testing"

	"github.com/xrcrun/xrc/softhca/roce"
	"github.com/xrcrun/xrc/verbs"
)

// TestReadResponseOverMTU: a READ's responses are segmented by the path
// MTU, each at most an MTU long; one longer is a bad response, which fails
// the READ. Before, an ONLY response carrying a whole READ of two MTUs was
// taken: the READ's data was placed and the READ marked answered, but the
// response acknowledged only the READ's first PSN, so it never completed
// (with a transport timer, it failed with RETRY_EXC_ERR in the end).
func TestReadResponseOverMTU(t *testing.T) {
	for _, tc := range []struct {
		name string
		ops  []roce.Opcode
		lens []int
	}{
		{"Only", []roce.Opcode{roce.ReadResponseOnly}, []int{2048}},
		{"Last", []roce.Opcode{roce.ReadResponseFirst, roce.ReadResponseLast}, []int{1024, 2048}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t) // MTU 1024
			r.noTimer(7)
			total := 0
			for _, n := range tc.lens {
				total += n
			}
			if err := r.qp.PostSend(&verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
				SG: []verbs.SGE{r.mr.SGE(0, total)}, RemoteAddr: 0x1000, RKey: 0x77}); err != nil {
				t.Fatal(err)
			}
			r.sink.collect(t, 1)
			for i, op := range tc.ops {
				r.inject(carrying(op, 0x1234+uint32(i), bytes.Repeat([]byte{'M'}, tc.lens[i])))
			}
			r.wantWC(t, 1, verbs.WCBadRespErr)
		})
	}
}
