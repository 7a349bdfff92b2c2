package mlx4_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"unsafe"

	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/uverbs"
	"github.com/xrcrun/xrc/mlx4"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

// patchKernel rewrites the response of one command, as a misbehaving
// kernel or device process could write it.
type patchKernel struct {
	mlx4.Kernel
	op    uint32
	size  int
	patch func(resp []byte)
}

func (k *patchKernel) Write(cmd []byte) (int, error) {
	n, err := k.Kernel.Write(cmd)
	if err == nil && binary.NativeEndian.Uint32(cmd) == k.op {
		resp := *(*unsafe.Pointer)(unsafe.Pointer(&cmd[8])) // the response's address
		k.patch(unsafe.Slice((*byte)(resp), k.size))
	}
	return n, err
}

// TestBadCQESize: a device that says its CQEs are neither 32 nor 64 bytes
// is refused at Open; the size was taken as it came, and CreateCQ then
// sliced its ring at negative offsets.
func TestBadCQESize(t *testing.T) {
	d, err := softhca.New(context.Background(), softhca.Config{Name: "mlx4cqe", Addr: netip.MustParseAddr("127.3.4.1")})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, size := range []uint32{16, 48, 128} {
		k, err := d.Kernel()
		if err != nil {
			t.Fatal(err)
		}
		var resp mlx4abi.AllocUcontextResp
		sizeAt := int(unsafe.Offsetof(resp.Drv) + unsafe.Offsetof(resp.Drv.CQESize))
		capsAt := int(unsafe.Offsetof(resp.Drv) + unsafe.Offsetof(resp.Drv.DevCaps))
		pk := &patchKernel{Kernel: k, op: uverbs.CmdGetContext, size: int(unsafe.Sizeof(resp)), patch: func(b []byte) {
			binary.NativeEndian.PutUint32(b[capsAt:], mlx4abi.UserDevCapLargeCQE)
			binary.NativeEndian.PutUint32(b[sizeAt:], size)
		}}
		p, err := mlx4.Open(pk)
		if !errors.Is(err, syscall.EPROTO) {
			if err == nil {
				p.Close()
			}
			t.Errorf("Open with %d-byte CQEs: %v", size, err)
		}
		k.Close()
	}
}

// TestBadNumbers: a QP whose number, as the device gives it, is beyond
// 24 bits or a live QP's is refused and destroyed; the number was taken as
// it came, and grew the lookup table by the number's size or took the
// other QP's entry.
func TestBadNumbers(t *testing.T) {
	d, err := softhca.New(context.Background(), softhca.Config{Name: "mlx4qpn", Addr: netip.MustParseAddr("127.3.4.2")})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	k, err := d.Kernel()
	if err != nil {
		t.Fatal(err)
	}
	var resp uverbs.CreateQPResp
	qpnAt := int(unsafe.Offsetof(resp.QPN))
	var forced uint32 // 0: leave the device's number
	pk := &patchKernel{Kernel: k, op: uverbs.CmdCreateQP, size: int(unsafe.Sizeof(resp)), patch: func(b []byte) {
		if forced != 0 {
			binary.NativeEndian.PutUint32(b[qpnAt:], forced)
		}
	}}
	c, err := mlx4.Open(pk)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := c.CreateCQ(verbs.CQInit{CQE: 16})
	if err != nil {
		t.Fatal(err)
	}
	create := func() (verbs.ProviderQP, error) {
		return pd.CreateQP(verbs.QPInit{Type: verbs.QPTRC, SendCQ: cq, RecvCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	}
	live, err := create()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []uint32{1 << 24, 0xffffffff, live.Num()} {
		forced = n
		qp, err := create()
		if !errors.Is(err, syscall.EPROTO) {
			if err == nil {
				qp.Destroy()
			}
			t.Errorf("a QP numbered %#x: %v", n, err)
		}
		if got := d.Objects().QPs; got != 1 {
			t.Errorf("after a QP numbered %#x the device holds %d QPs, want 1", n, got)
		}
	}
}
