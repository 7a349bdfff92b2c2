//go:build linux

package softhca

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/xrcrun/xrc/internal/qpstate"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/softhca/roce"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

// countingMemory counts the client memory's writev calls, and fails them
// (EFAULT) when fail is set.
type countingMemory struct {
	memory
	writevs int
	fail    bool
}

func (m *countingMemory) writev(addr uint64, bs [][]byte) error {
	m.writevs++
	if m.fail {
		return unix.Error(unix.EFAULT, "the test unmapped it")
	}
	return m.memory.writev(addr, bs)
}

// The packets of an RDMA WRITE into memory the device reaches through the
// client's process are written with one process_vm_writev a round, not
// one each, before the acknowledgement; when that write fails, the WRITE
// is NAKed from its first packet (remote operation error), the QP goes to
// the error state, and no acknowledgement goes out. With immediate data
// and no receive posted, the bytes before the last packet are written
// before its RNR NAK would acknowledge them: failing, they get the NAK
// of their own, and no RNR NAK goes out.
func TestWriteRun(t *testing.T) {
	for _, c := range []struct {
		name      string
		fail, imm bool
	}{{"written", false, false}, {"unwritable", true, false}, {"unwritable, then no receive", true, true}} {
		fail := c.fail
		t.Run(c.name, func(t *testing.T) {
			r := newRigAll(t, verbstest.Options{}, true)
			q := r.d.qps.get(r.qp.Num())
			const mtu, psn, n = 1024, 0x1234, 6 // verbstest's MTU and first PSN
			msg := make([]byte, n*mtu)          // the link's buffer: outside the packets
			rng := rand.New(rand.NewPCG(5, 6))
			for i := range msg {
				msg[i] = byte(rng.Uint32())
			}
			r.d.mu.Lock()
			mem := &countingMemory{memory: q.client.mem, fail: fail}
			q.client.mem = mem
			r.d.mu.Unlock()
			t.Cleanup(func() {
				r.d.mu.Lock()
				q.client.mem = mem.memory
				r.d.mu.Unlock()
			})
			var ps []*roce.Packet
			for i := range n {
				p := getPacket()
				p.SrcGID, p.DstGID, p.DestQP, p.PKey = r.sink.gid, r.d.gid, r.qp.Num(), 0xffff
				p.PSN, p.Opcode, p.Payload = psn+uint32(i), roce.WriteMiddle, msg[i*mtu:(i+1)*mtu]
				switch i {
				case 0:
					p.Opcode, p.VA, p.RKey, p.DMALen = roce.WriteFirst, r.mr.Addr()+4096, r.mr.RKey(), n*mtu
				case n - 1:
					p.Opcode, p.AckReq = roce.WriteLast, true
					if c.imm {
						p.Opcode, p.Imm = roce.WriteLastImm, 7 // no receive is posted
					}
				}
				ps = append(ps, p)
			}
			r.d.eng.deliverAll(ps)
			got := r.sink.collect(t, 1)
			waitFor(t, "the device quiet", r.d.eng.quiet)
			got = append(got, r.sink.drain()...)
			a := got[0]
			r.d.mu.Lock()
			writevs, state := mem.writevs, q.state
			r.d.mu.Unlock()
			if writevs != 1 {
				t.Errorf("%d process_vm_writev calls for the %d packets, want 1", writevs, n)
			}
			if !fail {
				if a.Opcode != roce.Acknowledge || a.Syndrome&roce.AETHKind != roce.AETHAck || a.PSN != psn+n-1 {
					t.Fatalf("%v syndrome %#x PSN %#x, want the ACK of PSN %#x", a.Opcode, a.Syndrome, a.PSN, psn+n-1)
				}
				if !bytes.Equal(r.buf[4096:4096+n*mtu], msg) {
					t.Error("the WRITE's bytes are not in memory")
				}
				for _, p := range got[1:] {
					t.Errorf("then %v syndrome %#x PSN %#x", p.Opcode, p.Syndrome, p.PSN)
				}
				return
			}
			if a.Opcode != roce.Acknowledge || a.Syndrome != roce.AETHNak|roce.NakRemoteOpErr || a.PSN != psn || state != qpstate.Err {
				t.Errorf("%v syndrome %#x PSN %#x, QP %v; want a remote operation NAK of PSN %#x and the error state",
					a.Opcode, a.Syndrome, a.PSN, state, psn)
			}
			for _, p := range got[1:] {
				t.Errorf("then %v syndrome %#x PSN %#x", p.Opcode, p.Syndrome, p.PSN)
			}
		})
	}
}
