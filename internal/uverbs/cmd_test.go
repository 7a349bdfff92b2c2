//go:build linux

package uverbs

import (
	"encoding/binary"
	"errors"
	"syscall"
	"testing"
	"unsafe"

	"github.com/xrcrun/xrc/internal/unix"
)

// fakeFile plays the kernel: it checks the framing it receives and writes
// a response where the command says.
type fakeFile struct {
	t     *testing.T
	last  []byte
	resp  []byte
	errno syscall.Errno
}

func (f *fakeFile) Write(b []byte) (int, error) {
	f.last = append([]byte(nil), b...)
	if f.errno != 0 {
		return 0, f.errno
	}
	hdr, _ := Decode[CmdHdr](b)
	var addr uint64
	if hdr.Command&CmdFlagExtended != 0 {
		ex, _ := Decode[ExCmdHdr](b[HdrSize:])
		addr = ex.Response
	} else if hdr.OutWords > 0 {
		addr = binary.NativeEndian.Uint64(b[HdrSize:])
	}
	if addr != 0 {
		copy(unix.Bytes(uintptr(addr), len(f.resp)), f.resp)
	}
	return len(b), nil
}

func TestExecFraming(t *testing.T) {
	f := &fakeFile{t: t}
	c, err := NewConn(f)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := CreateCQResp{CQHandle: 7, CQE: 63}
	f.resp = BytesOf(&want)
	req := Cmd[CreateCQ]{Core: CreateCQ{UserHandle: 99, CQE: 63, CompChannel: -1}}
	var resp CreateCQResp
	if err := Exec(c, CmdCreateCQ, &req, &resp); err != nil {
		t.Fatal(err)
	}
	if resp != want {
		t.Fatalf("response %+v, want %+v", resp, want)
	}
	hdr, _ := Decode[CmdHdr](f.last)
	if hdr.Command != CmdCreateCQ || int(hdr.InWords)*4 != len(f.last) || int(hdr.OutWords)*4 != int(unsafeSize(resp)) {
		t.Fatalf("header %+v for %d bytes", hdr, len(f.last))
	}
	sent, _ := Decode[Cmd[CreateCQ]](f.last)
	if sent.Core.Response == 0 || sent.Core.UserHandle != 99 || sent.Core.CompChannel != -1 {
		t.Fatalf("payload %+v", sent.Core)
	}
	// No response: no response address, out_words 0.
	if err := ExecNoResp(c, CmdDeallocPD, &Cmd[DeallocPD]{Core: DeallocPD{PDHandle: 3}}); err != nil {
		t.Fatal(err)
	}
	hdr, _ = Decode[CmdHdr](f.last)
	if hdr.OutWords != 0 || hdr.InWords != 3 {
		t.Fatalf("dealloc header %+v", hdr)
	}
	// The device's errno comes back wrapped.
	f.errno = syscall.EBUSY
	err = ExecNoResp(c, CmdDeallocPD, &Cmd[DeallocPD]{})
	if !errors.Is(err, syscall.EBUSY) || err == error(syscall.EBUSY) {
		t.Fatalf("error %v (%T): want a wrapped EBUSY", err, err)
	}
}

func TestExecExFraming(t *testing.T) {
	f := &fakeFile{t: t}
	c, err := NewConn(f)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	type req struct {
		Hdr   CmdHdr
		ExHdr ExCmdHdr
		Core  ExCreateCQ
		Drv   [16]byte
	}
	type resp struct {
		Core ExCreateCQResp
		Drv  [8]byte
	}
	want := resp{Core: ExCreateCQResp{Base: CreateCQResp{CQHandle: 1}}}
	f.resp = BytesOf(&want)
	var r resp
	if err := ExecEx(c, ExCmdCreateCQ, &req{Core: ExCreateCQ{CQE: 10}}, int(unsafeSize(ExCreateCQ{})), &r, int(unsafeSize(ExCreateCQResp{}))); err != nil {
		t.Fatal(err)
	}
	hdr, _ := Decode[CmdHdr](f.last)
	ex, _ := Decode[ExCmdHdr](f.last[HdrSize:])
	if hdr.Command != ExCmdCreateCQ|CmdFlagExtended || int(hdr.InWords)*8 != int(unsafeSize(ExCreateCQ{})) ||
		ex.ProviderInWords != 2 || ex.ProviderOutWords != 1 || int(hdr.OutWords)*8 != int(unsafeSize(ExCreateCQResp{})) || ex.Response == 0 {
		t.Fatalf("headers %+v %+v", hdr, ex)
	}
	if r.Core.Base.CQHandle != 1 {
		t.Fatalf("response %+v", r)
	}
}

func unsafeSize[T any](v T) uintptr { return unsafe.Sizeof(v) }
