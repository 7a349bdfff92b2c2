//go:build linux

package mlx4abi

import (
	"structs"

	"github.com/xrcrun/xrc/internal/uverbs"
)

// The command and response structs below are the uverbs ones with mlx4's
// driver data appended, as rdma-core's DECLARE_DRV_CMD builds them: a
// command is the header, the core payload and the driver payload, a
// response the core response and the driver response. Embedding the generic
// struct whole, rather than copying its fields, is what lets the generic part
// grow without breaking the provider: the layout test checks that no padding
// creeps in between the parts.

// AllocUcontextResp is GET_CONTEXT's response (mlx4_alloc_ucontext_resp).
type AllocUcontextResp struct {
	_    structs.HostLayout
	Core uverbs.GetContextResp
	Drv  IBAllocUcontextResp
}

// AllocPDResp is ALLOC_PD's response (mlx4_alloc_pd_resp).
type AllocPDResp struct {
	_    structs.HostLayout
	Core uverbs.AllocPDResp
	Drv  IBAllocPDResp
}

// CreateCQ is the CREATE_CQ command (mlx4_create_cq).
type CreateCQ struct {
	_    structs.HostLayout
	Hdr  uverbs.CmdHdr
	Core uverbs.CreateCQ
	Drv  IBCreateCQ
}

// CreateCQResp is CREATE_CQ's response (mlx4_create_cq_resp).
type CreateCQResp struct {
	_    structs.HostLayout
	Core uverbs.CreateCQResp
	Drv  IBCreateCQResp
}

// CreateSRQ is the CREATE_SRQ command (mlx4_create_srq).
type CreateSRQ struct {
	_    structs.HostLayout
	Hdr  uverbs.CmdHdr
	Core uverbs.CreateSRQ
	Drv  IBCreateSRQ
}

// CreateXSRQ is the CREATE_XSRQ command (mlx4_create_xsrq).
type CreateXSRQ struct {
	_    structs.HostLayout
	Hdr  uverbs.CmdHdr
	Core uverbs.CreateXSRQ
	Drv  IBCreateSRQ
}

// CreateSRQResp is the response of CREATE_SRQ and CREATE_XSRQ
// (mlx4_create_srq_resp).
type CreateSRQResp struct {
	_    structs.HostLayout
	Core uverbs.CreateSRQResp
	Drv  IBCreateSRQResp
}

// CreateQP is the CREATE_QP command (mlx4_create_qp); its response has no
// driver part.
type CreateQP struct {
	_    structs.HostLayout
	Hdr  uverbs.CmdHdr
	Core uverbs.CreateQP
	Drv  IBCreateQP
}
