//go:build linux

package softhca

import (
	"bytes"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca/roce"
)

// TestDuplicateReadServesTheOriginal: a duplicate READ is answered from
// what the responder remembered of the original (its address, length and
// key, checked again), at the place its PSN names; the address and length
// the duplicate carries are not used, so one that asks for memory outside
// the original gets nothing more than the original's bytes.
func TestDuplicateReadServesTheOriginal(t *testing.T) {
	r := newRig(t)
	copy(r.buf, bytes.Repeat([]byte{'A'}, 16))
	copy(r.buf[16:], bytes.Repeat([]byte{'S'}, 4096))
	va, rkey := r.mr.Addr(), r.mr.RKey()
	read := func(va uint64, n uint32) {
		r.inject(func(p *roce.Packet) {
			p.Opcode, p.PSN, p.VA, p.RKey, p.DMALen = roce.ReadRequest, 0x1234, va, rkey, n
		})
	}
	read(va, 16)
	r.sink.collect(t, 1)
	for _, dup := range []struct {
		va uint64
		n  uint32
	}{{va + 16, 16}, {va, 4096}, {va + 8, 1024}} {
		read(dup.va, dup.n)
		got := r.sink.collect(t, 1)
		time.Sleep(10 * time.Millisecond)
		got = append(got, r.sink.drain()...)
		for _, p := range got {
			if p.Opcode != roce.ReadResponseOnly || p.PSN != 0x1234 || !bytes.Equal(p.Payload, r.buf[:16]) {
				t.Errorf("duplicate READ of %d bytes at +%d: %v PSN %#x %q, want the original's 16 bytes",
					dup.n, dup.va-va, p.Opcode, p.PSN, p.Payload)
			}
		}
	}
}
