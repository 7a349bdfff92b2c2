package softhca

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
)

func testClient(t *testing.T) (*Device, *Client, *fakeMemory) {
	t.Helper()
	d, err := New(context.Background(), Config{Name: "cmdtest", Addr: netip.MustParseAddr("127.9.8.1")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	mem := newFakeMemory(fuzzBase, fuzzSize)
	c, err := d.connect(mem)
	if err != nil {
		t.Fatal(err)
	}
	return d, c, mem
}

func want(t *testing.T, err error, errno unix.Errno, what string) {
	t.Helper()
	if !errors.Is(err, errno) {
		t.Fatalf("%s: %v, want %v", what, err, errno)
	}
}

func TestCommandFraming(t *testing.T) {
	d, c, mem := testClient(t)
	getCtx := frame(uverbs.CmdGetContext, &uverbs.Cmd[uverbs.GetContext]{}, 32)
	allocPD := frame(uverbs.CmdAllocPD, &uverbs.Cmd[uverbs.AllocPD]{}, 12)

	_, err := c.Write(allocPD)
	want(t, err, unix.EINVAL, "command before GET_CONTEXT")
	_, err = c.Write(getCtx[:5])
	want(t, err, unix.EINVAL, "command shorter than its header")
	bad := append([]byte(nil), getCtx...)
	binary.NativeEndian.PutUint16(bad[4:], 3)
	_, err = c.Write(bad)
	want(t, err, unix.EINVAL, "in_words not matching the write")
	bad = append([]byte(nil), getCtx...)
	binary.NativeEndian.PutUint32(bad[0:], 0x40000000)
	_, err = c.Write(bad)
	want(t, err, unix.EINVAL, "unknown bits in the command word")
	bad = append([]byte(nil), getCtx...)
	binary.NativeEndian.PutUint64(bad[8:], 0x1000) // response to unmapped memory
	_, err = c.Write(bad)
	want(t, err, unix.EFAULT, "response to a bad address")
	if n, err := c.Write(getCtx); err != nil || n != len(getCtx) {
		t.Fatalf("GET_CONTEXT: %d, %v", n, err)
	}
	resp, _ := uverbs.Decode[mlx4abi.AllocUcontextResp](mem.mem)
	if resp.Core.NumCompVectors != numCompVectors || resp.Drv.CQESize != cqeSize || resp.Drv.QPTabSize != maxQP {
		t.Fatalf("GET_CONTEXT response %+v", resp)
	}
	_, err = c.Write(getCtx)
	want(t, err, unix.EINVAL, "second GET_CONTEXT")

	// A response buffer smaller than the core response: ENOSPC.
	_, err = c.Write(frame(uverbs.CmdAllocPD, &uverbs.Cmd[uverbs.AllocPD]{}, 0))
	want(t, err, unix.ENOSPC, "ALLOC_PD without a response buffer")
	_, err = c.Write(frame(uverbs.CmdAllocPD, &uverbs.Cmd[uverbs.DeallocPD]{}, 0))
	want(t, err, unix.ENOSPC, "request shorter than the command's")
	small := frame(uverbs.CmdQueryPort, &uverbs.Cmd[uverbs.QueryPort]{Core: uverbs.QueryPort{PortNum: 1}}, 8)
	_, err = c.Write(small)
	want(t, err, unix.ENOSPC, "response buffer too small")
	_, err = c.Write(frame(99, &uverbs.Cmd[uverbs.GetContext]{}, 0))
	want(t, err, unix.EOPNOTSUPP, "unknown command")
	ex := make([]byte, 24)
	binary.NativeEndian.PutUint32(ex[0:], uverbs.CmdFlagExtended|uverbs.ExCmdQueryDevice)
	_, err = c.Write(ex)
	want(t, err, unix.EOPNOTSUPP, "extended command")
	binary.NativeEndian.PutUint16(ex[4:], 5)
	_, err = c.Write(ex)
	want(t, err, unix.EINVAL, "extended command with wrong words")

	// Handles are checked by type and owner.
	_, err = c.Write(frame(uverbs.CmdDeallocPD, &uverbs.Cmd[uverbs.DeallocPD]{Core: uverbs.DeallocPD{PDHandle: 42}}, 0))
	want(t, err, unix.EINVAL, "unknown handle")
	_, err = c.Write(frame(uverbs.CmdCreateCQ, &mlx4abi.CreateCQ{
		Core: uverbs.CreateCQ{CQE: 7, CompChannel: -1}, Drv: mlx4abi.IBCreateCQ{BufAddr: 0x1000, DBAddr: cqDB}}, 16))
	want(t, err, unix.EFAULT, "CQ buffer outside the client's queue memory")
	_, err = c.Write(frame(uverbs.CmdCreateCQ, &mlx4abi.CreateCQ{
		Core: uverbs.CreateCQ{CQE: 7, CompChannel: 1234}, Drv: mlx4abi.IBCreateCQ{BufAddr: cqAddr, DBAddr: cqDB}}, 16))
	want(t, err, unix.EINVAL, "unknown completion channel")
	_, err = c.Write(frame(uverbs.CmdRegMR, &uverbs.Cmd[uverbs.RegMR]{Core: uverbs.RegMR{
		Start: mrAddr, Length: 64, HCAVA: mrAddr, PDHandle: 1, AccessFlags: uverbs.AccessRemoteWrite}}, 12))
	want(t, err, unix.EINVAL, "remote write without local write")
	if c := d.counters.BadCommands.Load(); c < 10 {
		t.Fatalf("bad commands counted: %d", c)
	}
	if o := d.Objects(); o.PDs != 0 || o.CQs != 0 || o.MRs != 0 {
		t.Fatalf("objects after failed commands: %+v", o)
	}
}
