//go:build linux

package mlx4abi

import (
	"reflect"
	"testing"

	"github.com/xrcrun/xrc/internal/abitest"
)

// TestLayout compares the generated mlx4 structs with gcc's layout of
// <rdma/mlx4-abi.h>.
func TestLayout(t *testing.T) {
	abitest.Check(t, layoutIncludes, generatedLayouts)
}

// embeddingIncludes declares the C counterparts of the embedding structs the
// way rdma-core's DECLARE_DRV_CMD lays them out.
const embeddingIncludes = `
#include <rdma/ib_user_verbs.h>
#include <rdma/mlx4-abi.h>
struct x_alloc_ucontext_resp { struct ib_uverbs_get_context_resp core; struct mlx4_ib_alloc_ucontext_resp drv; };
struct x_alloc_pd_resp { struct ib_uverbs_alloc_pd_resp core; struct mlx4_ib_alloc_pd_resp drv; };
struct x_create_cq { struct ib_uverbs_cmd_hdr hdr; struct ib_uverbs_create_cq core; struct mlx4_ib_create_cq drv; };
struct x_create_cq_resp { struct ib_uverbs_create_cq_resp core; struct mlx4_ib_create_cq_resp drv; };
struct x_create_srq { struct ib_uverbs_cmd_hdr hdr; struct ib_uverbs_create_srq core; struct mlx4_ib_create_srq drv; };
struct x_create_xsrq { struct ib_uverbs_cmd_hdr hdr; struct ib_uverbs_create_xsrq core; struct mlx4_ib_create_srq drv; };
struct x_create_srq_resp { struct ib_uverbs_create_srq_resp core; struct mlx4_ib_create_srq_resp drv; };
struct x_create_qp { struct ib_uverbs_cmd_hdr hdr; struct ib_uverbs_create_qp core; struct mlx4_ib_create_qp drv; };
`

// TestEmbeddingLayout checks that every command struct embeds the generic
// parts and the driver part at the offsets C gives them.
func TestEmbeddingLayout(t *testing.T) {
	parts := func(names ...string) [][2]string {
		var f [][2]string
		for _, n := range names {
			f = append(f, [2]string{n, map[string]string{"hdr": "Hdr", "core": "Core", "drv": "Drv"}[n]})
		}
		return f
	}
	abitest.Check(t, embeddingIncludes, []abitest.Case{
		{C: "struct x_alloc_ucontext_resp", Go: reflect.TypeFor[AllocUcontextResp](), Fields: parts("core", "drv")},
		{C: "struct x_alloc_pd_resp", Go: reflect.TypeFor[AllocPDResp](), Fields: parts("core", "drv")},
		{C: "struct x_create_cq", Go: reflect.TypeFor[CreateCQ](), Fields: parts("hdr", "core", "drv")},
		{C: "struct x_create_cq_resp", Go: reflect.TypeFor[CreateCQResp](), Fields: parts("core", "drv")},
		{C: "struct x_create_srq", Go: reflect.TypeFor[CreateSRQ](), Fields: parts("hdr", "core", "drv")},
		{C: "struct x_create_xsrq", Go: reflect.TypeFor[CreateXSRQ](), Fields: parts("hdr", "core", "drv")},
		{C: "struct x_create_srq_resp", Go: reflect.TypeFor[CreateSRQResp](), Fields: parts("core", "drv")},
		{C: "struct x_create_qp", Go: reflect.TypeFor[CreateQP](), Fields: parts("hdr", "core", "drv")},
	})
}
