//go:build ignore

// This file is the input of `go generate`: it names every struct and
// constant of <rdma/mlx4-abi.h> that the package exports. See
// internal/cmd/mkabi.

package mlx4abi

/*
#include <rdma/mlx4-abi.h>
*/
import "C"

type (
	IBAllocUcontextRespV3   C.struct_mlx4_ib_alloc_ucontext_resp_v3
	IBAllocUcontextResp     C.struct_mlx4_ib_alloc_ucontext_resp
	IBAllocPDResp           C.struct_mlx4_ib_alloc_pd_resp
	IBCreateCQ              C.struct_mlx4_ib_create_cq
	IBCreateCQResp          C.struct_mlx4_ib_create_cq_resp
	IBResizeCQ              C.struct_mlx4_ib_resize_cq
	IBCreateSRQ             C.struct_mlx4_ib_create_srq
	IBCreateSRQResp         C.struct_mlx4_ib_create_srq_resp
	IBCreateQPRSS           C.struct_mlx4_ib_create_qp_rss
	IBCreateQP              C.struct_mlx4_ib_create_qp
	IBCreateWQ              C.struct_mlx4_ib_create_wq
	IBModifyWQ              C.struct_mlx4_ib_modify_wq
	IBCreateRWQIndTblResp   C.struct_mlx4_ib_create_rwq_ind_tbl_resp
	IBRSSCaps               C.struct_mlx4_ib_rss_caps
	IBTSOCaps               C.struct_mlx4_ib_tso_caps
	UverbsExQueryDeviceResp C.struct_mlx4_uverbs_ex_query_device_resp
)

const (
	IBUverbsNoDevCapsABIVersion = C.MLX4_IB_UVERBS_NO_DEV_CAPS_ABI_VERSION
	IBUverbsABIVersion          = C.MLX4_IB_UVERBS_ABI_VERSION
	UserDevCapLargeCQE          = C.MLX4_USER_DEV_CAP_LARGE_CQE
)
