//go:build linux

package softhca

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/xrcrun/xrc/internal/qpstate"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/softhca/roce"
	"github.com/xrcrun/xrc/verbs"
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

// countWrites puts a countingMemory in place of q's client memory until
// the test ends.
func (r *rig) countWrites(t *testing.T, q *qp, fail bool) *countingMemory {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	mem := &countingMemory{memory: q.client.mem, fail: fail}
	q.client.mem = mem
	t.Cleanup(func() {
		r.d.mu.Lock()
		q.client.mem = mem.memory
		r.d.mu.Unlock()
	})
	return mem
}

// The packets of an RDMA WRITE or a SEND into memory the device reaches
// through the client's process are written with one process_vm_writev a
// round, not one each, before the acknowledgement (and the SEND's receive
// completion); when that write fails, the message is NAKed from its first
// packet (remote operation error), the QP goes to the error state, a
// SEND's receive fails, and no acknowledgement goes out. With immediate
// data and no receive posted, the bytes before a WRITE's last packet are
// written before its RNR NAK would acknowledge them: failing, they get the
// NAK of their own, and no RNR NAK goes out.
func TestWriteRun(t *testing.T) {
	for _, c := range []struct {
		name            string
		send, fail, imm bool
	}{
		{"WRITE written", false, false, false}, {"WRITE unwritable", false, true, false},
		{"WRITE unwritable, then no receive", false, true, true},
		{"SEND written", true, false, false}, {"SEND unwritable", true, true, false},
	} {
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
			mem := r.countWrites(t, q, fail)
			if c.send {
				if err := r.qp.PostRecv(&verbs.RecvWR{WRID: 5, SG: []verbs.SGE{r.mr.SGE(4096, n*mtu)}}); err != nil {
					t.Fatal(err)
				}
			}
			var ps []*roce.Packet
			for i := range n {
				p := getPacket()
				p.SrcGID, p.DstGID, p.DestQP, p.PKey = r.sink.gid, r.d.gid, r.qp.Num(), 0xffff
				p.PSN, p.Payload = psn+uint32(i), msg[i*mtu:(i+1)*mtu]
				first, middle, last := roce.WriteFirst, roce.WriteMiddle, roce.WriteLast
				if c.send {
					first, middle, last = roce.SendFirst, roce.SendMiddle, roce.SendLast
				}
				p.Opcode = middle
				switch i {
				case 0:
					p.Opcode, p.VA, p.RKey, p.DMALen = first, r.mr.Addr()+4096, r.mr.RKey(), n*mtu
				case n - 1:
					p.Opcode, p.AckReq = last, true
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
					t.Error("the message's bytes are not in memory")
				}
				if c.send {
					if wc := pollWait(t, r.cq); wc.Status != verbs.WCSuccess || wc.WRID != 5 || wc.ByteLen != n*mtu {
						t.Errorf("receive completion %+v", wc)
					}
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
			if c.send {
				if wc := pollWait(t, r.cq); wc.Status != verbs.WCLocProtErr || wc.WRID != 5 {
					t.Errorf("receive completion %+v, want a local protection error", wc)
				}
				wc := make([]verbs.WorkCompletion, 2)
				if k, _ := r.cq.Poll(wc); k != 0 {
					t.Errorf("more completions: %+v", wc[:k])
				}
			}
		})
	}
}

// A SEND that fails after some of its packets joined the run (it is longer
// than its receive) drops the run: the receive's error completion says the
// buffer is the client's again, and nothing may be written into it after.
func TestWriteRunDroppedWithItsReceive(t *testing.T) {
	r := newRigAll(t, verbstest.Options{}, true)
	q := r.d.qps.get(r.qp.Num())
	const mtu, psn, n = 1024, 0x1234, 6
	msg := make([]byte, n*mtu)
	mem := r.countWrites(t, q, false)
	if err := r.qp.PostRecv(&verbs.RecvWR{WRID: 5, SG: []verbs.SGE{r.mr.SGE(4096, 4*mtu)}}); err != nil {
		t.Fatal(err)
	}
	var ps []*roce.Packet
	for i := range n {
		p := getPacket()
		p.SrcGID, p.DstGID, p.DestQP, p.PKey = r.sink.gid, r.d.gid, r.qp.Num(), 0xffff
		p.PSN, p.Opcode, p.Payload = psn+uint32(i), roce.SendMiddle, msg[i*mtu:(i+1)*mtu]
		switch i {
		case 0:
			p.Opcode = roce.SendFirst
		case n - 1:
			p.Opcode = roce.SendLast
		}
		ps = append(ps, p)
	}
	r.d.eng.deliverAll(ps)
	if wc := pollWait(t, r.cq); wc.Status != verbs.WCLocLenErr || wc.WRID != 5 {
		t.Errorf("receive completion %+v, want a local length error", wc)
	}
	waitFor(t, "the device quiet", r.d.eng.quiet)
	r.d.mu.Lock()
	writevs := mem.writevs
	r.d.mu.Unlock()
	if writevs != 0 {
		t.Errorf("%d process_vm_writev calls into the failed receive's buffer, want none", writevs)
	}
}
