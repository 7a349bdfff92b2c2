package softhca

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/qpstate"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
)

// The fuzz input is a script of records: a kind byte, a 16-bit length and
// that many bytes. Kind 0 writes a command, kind 1 rings a doorbell (a
// 32-bit offset and a 64-bit value).
const (
	recCommand  = 0
	recDoorbell = 1
)

const (
	fuzzBase = 0x7f0000000000 // where the fake client memory starts
	fuzzSize = 1 << 20
	respAddr = fuzzBase // responses land here
	mrAddr   = fuzzBase + 4096
	cqAddr   = fuzzBase + 65536
	cqDB     = fuzzBase + 8192
	rqDB     = fuzzBase + 8192 + 64
	srqDB    = fuzzBase + 8192 + 128
	qpAddr   = fuzzBase + 131072
	srqAddr  = fuzzBase + 262144
)

type script []byte

func (s *script) cmd(b []byte) {
	*s = append(*s, recCommand, byte(len(b)), byte(len(b)>>8))
	*s = append(*s, b...)
}

func (s *script) bell(off uint32, v uint64) {
	*s = append(*s, recDoorbell, 12, 0)
	*s = binary.NativeEndian.AppendUint32(*s, off)
	*s = binary.NativeEndian.AppendUint64(*s, v)
}

// frame builds a legacy command the way uverbs.Exec does.
func frame[T any](op uint32, req *T, respLen int) []byte {
	b := append([]byte(nil), uverbs.BytesOf(req)...)
	binary.NativeEndian.PutUint32(b[0:], op)
	binary.NativeEndian.PutUint16(b[4:], uint16(len(b)/4))
	binary.NativeEndian.PutUint16(b[6:], uint16(respLen/4))
	if respLen > 0 {
		binary.NativeEndian.PutUint64(b[8:], respAddr)
	}
	return b
}

// bringUp is a script that creates one of everything and connects a QP to
// itself: the seed the fuzzer starts from.
func bringUp() script {
	var s script
	s.cmd(frame(uverbs.CmdGetContext, &uverbs.Cmd[uverbs.GetContext]{}, 32))
	s.cmd(frame(uverbs.CmdQueryDevice, &uverbs.Cmd[uverbs.QueryDevice]{}, 176))
	s.cmd(frame(uverbs.CmdQueryPort, &uverbs.Cmd[uverbs.QueryPort]{Core: uverbs.QueryPort{PortNum: 1}}, 40))
	s.cmd(frame(uverbs.CmdAllocPD, &uverbs.Cmd[uverbs.AllocPD]{}, 12)) // handle 1
	s.cmd(frame(uverbs.CmdRegMR, &uverbs.Cmd[uverbs.RegMR]{Core: uverbs.RegMR{
		Start: mrAddr, Length: 4096, HCAVA: mrAddr, PDHandle: 1, AccessFlags: 0xf}}, 12)) // 2
	s.cmd(frame(uverbs.CmdCreateCQ, &mlx4abi.CreateCQ{
		Core: uverbs.CreateCQ{CQE: 63, CompChannel: -1}, Drv: mlx4abi.IBCreateCQ{BufAddr: cqAddr, DBAddr: cqDB}}, 16)) // 3
	s.cmd(frame(uverbs.CmdCreateSRQ, &mlx4abi.CreateSRQ{
		Core: uverbs.CreateSRQ{PDHandle: 1, MaxWR: 15, MaxSGE: 1}, Drv: mlx4abi.IBCreateSRQ{BufAddr: srqAddr, DBAddr: srqDB}}, 24)) // 4
	s.cmd(frame(uverbs.CmdCreateQP, &mlx4abi.CreateQP{
		Core: uverbs.CreateQP{PDHandle: 1, SendCQHandle: 3, RecvCQHandle: 3, MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1, QPType: 2},
		Drv:  mlx4abi.IBCreateQP{BufAddr: qpAddr, DBAddr: rqDB, LogSQBbCount: 4, LogSQStride: 6}}, 32)) // 5
	modify := func(state qpstate.State, mask qpstate.Mask) {
		m := uverbs.ModifyQP{QPHandle: 5, AttrMask: uint32(mask), QPState: uint8(state), PortNum: 1,
			QPAccessFlags: 0xe, PathMTU: 3, DestQPNum: firstQPN, Timeout: 10, RetryCnt: 1, RNRRetry: 1, MinRNRTimer: 1}
		m.Dest.IsGlobal = 1
		copy(m.Dest.DGID[:], netip.MustParseAddr("127.9.9.9").AsSlice())
		s.cmd(frame(uverbs.CmdModifyQP, &uverbs.Cmd[uverbs.ModifyQP]{Core: m}, 0))
	}
	modify(qpstate.Init, qpstate.AttrState|qpstate.AttrPkeyIndex|qpstate.AttrPort|qpstate.AttrAccessFlags)
	modify(qpstate.RTR, qpstate.Required(qpstate.RC, qpstate.Init, qpstate.RTR)|qpstate.AttrState)
	modify(qpstate.RTS, qpstate.Required(qpstate.RC, qpstate.RTR, qpstate.RTS)|qpstate.AttrState)
	s.bell(mlx4hw.UARSendDoorbell, firstQPN<<8)
	s.bell(mlx4hw.UARCQDoorbell, uint64(2<<24|1)<<32)
	s.cmd(frame(uverbs.CmdQueryQP, &uverbs.Cmd[uverbs.QueryQP]{Core: uverbs.QueryQP{QPHandle: 5, AttrMask: 1}}, 128))
	s.cmd(frame(uverbs.CmdModifySRQ, &uverbs.Cmd[uverbs.ModifySRQ]{Core: uverbs.ModifySRQ{SRQHandle: 4, AttrMask: 2, SRQLimit: 2}}, 0))
	s.cmd(frame(uverbs.CmdDestroyCQ, &uverbs.Cmd[uverbs.DestroyCQ]{Core: uverbs.DestroyCQ{CQHandle: 3}}, 8)) // EBUSY
	s.cmd(frame(uverbs.CmdDestroyQP, &uverbs.Cmd[uverbs.DestroyQP]{Core: uverbs.DestroyQP{QPHandle: 5}}, 4))
	s.cmd(frame(uverbs.CmdCreateCompChannel, &uverbs.Cmd[uverbs.CreateCompChannel]{}, 4))
	return s
}

// runScript plays a script as one client and checks the invariants: no
// panic, each command either succeeds whole or fails with an errno, and
// once the client is gone the device holds nothing of it.
func runScript(t *testing.T, d *Device, s []byte) {
	mem := newFakeMemory(fuzzBase, fuzzSize)
	c, err := d.connect(mem)
	if err != nil {
		t.Fatal(err)
	}
	for len(s) >= 3 {
		kind, n := s[0], int(binary.LittleEndian.Uint16(s[1:]))
		s = s[3:]
		n = min(n, len(s))
		rec := s[:n]
		s = s[n:]
		switch kind % 2 {
		case recCommand:
			got, err := c.Write(rec)
			var errno unix.Errno
			if err == nil && got != len(rec) || err != nil && (got != 0 || !errors.As(err, &errno)) {
				t.Fatalf("command %x: returned %d, %v", rec, got, err)
			}
		case recDoorbell:
			if len(rec) == 12 {
				d.eng.ring(c, int(binary.NativeEndian.Uint32(rec)), binary.NativeEndian.Uint64(rec[4:]))
			}
		}
	}
	if err := c.Close(); err != nil {
		t.Fatalf("close client: %v", err)
	}
	for _, h := range c.handedOut { // what a client process would close
		unix.Close(h.fd)
	}
	if o := d.Objects(); o != (Objects{}) {
		t.Fatalf("objects left after the client closed: %+v", o)
	}
}

func FuzzCommand(f *testing.F) {
	full := bringUp()
	f.Add([]byte(full))
	// Each prefix of the bring-up, and each command alone.
	for i := 0; i+3 <= len(full); {
		n := 3 + int(binary.LittleEndian.Uint16(full[i+1:]))
		f.Add([]byte(full[:i+n]))
		f.Add([]byte(full[i : i+n]))
		i += n
	}
	d, err := New(context.Background(), Config{Name: "fuzz0", Addr: netip.MustParseAddr("127.9.9.9"), SpinIdle: -1})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { d.Close() })
	f.Fuzz(func(t *testing.T, s []byte) { runScript(t, d, s) })
}

// TestBringUpScript checks that the fuzz seed really does what it says: its
// commands succeed (but the destroy of a CQ in use), so the fuzzer starts
// from deep states.
func TestBringUpScript(t *testing.T) {
	d, err := New(context.Background(), Config{Name: "seed0", Addr: netip.MustParseAddr("127.9.9.8")})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	mem := newFakeMemory(fuzzBase, fuzzSize)
	c, err := d.connect(mem)
	if err != nil {
		t.Fatal(err)
	}
	s := []byte(bringUp())
	i := 0
	for len(s) >= 3 {
		n := int(binary.LittleEndian.Uint16(s[1:]))
		rec := s[3 : 3+n]
		if s[0] == recCommand {
			_, err := c.Write(rec)
			op := binary.NativeEndian.Uint32(rec)
			if op == uverbs.CmdDestroyCQ {
				if !errors.Is(err, unix.EBUSY) {
					t.Errorf("record %d: destroy of a CQ in use: %v, want EBUSY", i, err)
				}
			} else if err != nil {
				t.Errorf("record %d (command %d): %v", i, op, err)
			}
		}
		s = s[3+n:]
		i++
	}
	if o := d.Objects(); o.QPs != 0 || o.CQs != 1 || o.SRQs != 1 || o.MRs != 1 || o.PDs != 1 {
		t.Fatalf("objects after the script: %+v", o)
	}
	c.Close()
	if o := d.Objects(); o != (Objects{}) {
		t.Fatalf("objects left after the client closed: %+v", o)
	}
}
