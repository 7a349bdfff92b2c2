//go:build linux

package softhca

import (
	"bytes"
	"testing"

	"github.com/xrcrun/xrc/softhca/roce"
	"github.com/xrcrun/xrc/verbs/verbstest"
	"golang.org/x/sys/unix"
)

// writeThenStray delivers to the rig's QP, in one round, a WRITE ONLY of
// mtu bytes at PSN psn into its buffer at 4096 and then a WRITE MIDDLE at
// the next PSN with no message in progress, and returns the WRITE's bytes
// and what the device sent back once quiet.
func writeThenStray(t *testing.T, r *rig, mtu, psn uint32) ([]byte, []*roce.Packet) {
	msg := bytes.Repeat([]byte{0xab}, int(2*mtu)) // outside the packets' storage, as a received datagram
	w := getPacket()
	w.SrcGID, w.DstGID, w.DestQP, w.PKey = r.sink.gid, r.d.gid, r.qp.Num(), 0xffff
	w.Opcode, w.PSN, w.VA, w.RKey, w.DMALen, w.AckReq = roce.WriteOnly, psn, r.mr.Addr()+4096, r.mr.RKey(), mtu, true
	w.Payload = msg[:mtu]
	bad := getPacket()
	bad.SrcGID, bad.DstGID, bad.DestQP, bad.PKey = r.sink.gid, r.d.gid, r.qp.Num(), 0xffff
	bad.Opcode, bad.PSN, bad.Payload = roce.WriteMiddle, psn+1, msg[mtu:]
	r.d.eng.deliverAll([]*roce.Packet{w, bad})
	got := r.sink.collect(t, 1)
	waitFor(t, "the device quiet", r.d.eng.quiet)
	got = append(got, r.sink.drain()...)
	for _, p := range got {
		t.Logf("sent %v syndrome %#x PSN %#x", p.Opcode, p.Syndrome, p.PSN)
	}
	return msg, got
}

// TestRunOfAcknowledgedWrite: a complete RDMA WRITE (WRITE ONLY, in a run:
// memory reached through the client's process) is followed, in the same
// round, by a WRITE MIDDLE with the next PSN and no message in progress. The responder NAKs that packet
// (invalid request), which acknowledges the WRITE before it: the WRITE's
// bytes land. The error state dropped its run, and with it the bytes of a
// WRITE the requester was told had succeeded.
func TestRunOfAcknowledgedWrite(t *testing.T) {
	r := newRigAll(t, verbstest.Options{}, true)
	const mtu, psn = 1024, 0x1234
	msg, _ := writeThenStray(t, r, mtu, psn)
	if !bytes.Equal(r.buf[4096:4096+mtu], msg[:mtu]) {
		t.Fatalf("the WRITE of PSN %#x was acknowledged (NAK of PSN %#x) but its bytes are not in memory", psn, psn+1)
	}
}

// TestRunOfAcknowledgedWriteFails: if that run cannot be written (here the
// memory is read-only), the NAK is for its first packet, as a remote
// operational error, not for the packet that failed the QP: that one
// acknowledged the WRITE whose bytes did not land.
func TestRunOfAcknowledgedWriteFails(t *testing.T) {
	r := newRigAll(t, verbstest.Options{}, true)
	const mtu, psn = 1024, 0x1234
	if err := unix.Mprotect(r.buf, unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	defer unix.Mprotect(r.buf, unix.PROT_READ|unix.PROT_WRITE)
	msg, got := writeThenStray(t, r, mtu, psn)
	unix.Mprotect(r.buf, unix.PROT_READ|unix.PROT_WRITE)
	landed := bytes.Equal(r.buf[4096:4096+mtu], msg[:mtu])
	for _, p := range got {
		if p.PSN == psn+1 && !landed {
			t.Fatalf("NAK %#x at PSN %#x acknowledges the WRITE of PSN %#x, whose bytes did not land", p.Syndrome, p.PSN, psn)
		}
	}
}
