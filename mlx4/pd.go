//go:build linux

package mlx4

import (
	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/uverbs"
	"github.com/xrcrun/xrc/verbs"
)

// PD is a protection domain.
type PD struct {
	ctx    *Context
	handle uint32
	pdn    uint32
}

// AllocPD issues ALLOC_PD.
func (c *Context) AllocPD() (verbs.ProviderPD, error) {
	var req uverbs.Cmd[uverbs.AllocPD]
	var r mlx4abi.AllocPDResp
	if err := uverbs.Exec(c.conn, uverbs.CmdAllocPD, &req, &r); err != nil {
		return nil, err
	}
	return &PD{ctx: c, handle: r.Core.PDHandle, pdn: r.Drv.PDN}, nil
}

// Dealloc issues DEALLOC_PD.
func (pd *PD) Dealloc() error {
	req := uverbs.Cmd[uverbs.DeallocPD]{Core: uverbs.DeallocPD{PDHandle: pd.handle}}
	return destroyed(uverbs.ExecNoResp(pd.ctx.conn, uverbs.CmdDeallocPD, &req))
}

// MR is a memory region.
type MR struct {
	ctx        *Context
	handle     uint32
	lkey, rkey uint32
}

// RegMR issues REG_MR for [addr, addr+length), with the same I/O virtual
// address.
func (pd *PD) RegMR(addr uintptr, length uint64, access verbs.Access) (verbs.ProviderMR, error) {
	if s, ok := pd.ctx.k.(RegionSharer); ok {
		if err := s.ShareRegion(addr, length); err != nil {
			return nil, err
		}
	}
	req := uverbs.Cmd[uverbs.RegMR]{Core: uverbs.RegMR{
		Start: uint64(addr), Length: length, HCAVA: uint64(addr),
		PDHandle: pd.handle, AccessFlags: uint32(access),
	}}
	var r uverbs.RegMRResp
	if err := uverbs.Exec(pd.ctx.conn, uverbs.CmdRegMR, &req, &r); err != nil {
		return nil, err
	}
	return &MR{ctx: pd.ctx, handle: r.MRHandle, lkey: r.Lkey, rkey: r.Rkey}, nil
}

func (mr *MR) LKey() uint32 { return mr.lkey }
func (mr *MR) RKey() uint32 { return mr.rkey }

// Dereg issues DEREG_MR.
func (mr *MR) Dereg() error {
	req := uverbs.Cmd[uverbs.DeregMR]{Core: uverbs.DeregMR{MRHandle: mr.handle}}
	return destroyed(uverbs.ExecNoResp(mr.ctx.conn, uverbs.CmdDeregMR, &req))
}
