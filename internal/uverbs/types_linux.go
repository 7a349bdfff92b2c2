//go:build ignore

// This file is the input of `go generate`: it names every struct and
// constant of <rdma/ib_user_verbs.h> and <rdma/ib_user_ioctl_verbs.h> that
// the package exports. See internal/cmd/mkabi.

package uverbs

/*
#include <rdma/ib_user_verbs.h>
#include <rdma/ib_user_ioctl_verbs.h>
*/
import "C"

// Framing.
type (
	CmdHdr   C.struct_ib_uverbs_cmd_hdr
	ExCmdHdr C.struct_ib_uverbs_ex_cmd_hdr
)

// Events read from the async and completion-channel file descriptors.
type (
	AsyncEventDesc C.struct_ib_uverbs_async_event_desc
	CompEventDesc  C.struct_ib_uverbs_comp_event_desc
)

// Context and device.
type (
	GetContext       C.struct_ib_uverbs_get_context
	GetContextResp   C.struct_ib_uverbs_get_context_resp
	QueryDevice      C.struct_ib_uverbs_query_device
	QueryDeviceResp  C.struct_ib_uverbs_query_device_resp
	ExQueryDevice    C.struct_ib_uverbs_ex_query_device
	QueryPort        C.struct_ib_uverbs_query_port
	QueryPortResp    C.struct_ib_uverbs_query_port_resp
	QueryPortRespEx  C.struct_ib_uverbs_query_port_resp_ex
	CQModerationCaps C.struct_ib_uverbs_cq_moderation_caps
	RSSCaps          C.struct_ib_uverbs_rss_caps
	TMCaps           C.struct_ib_uverbs_tm_caps
	GIDEntry         C.struct_ib_uverbs_gid_entry
)

// Protection domains, XRC domains, memory regions and windows.
type (
	AllocPD      C.struct_ib_uverbs_alloc_pd
	AllocPDResp  C.struct_ib_uverbs_alloc_pd_resp
	DeallocPD    C.struct_ib_uverbs_dealloc_pd
	OpenXRCD     C.struct_ib_uverbs_open_xrcd
	OpenXRCDResp C.struct_ib_uverbs_open_xrcd_resp
	CloseXRCD    C.struct_ib_uverbs_close_xrcd
	RegMR        C.struct_ib_uverbs_reg_mr
	RegMRResp    C.struct_ib_uverbs_reg_mr_resp
	ReregMR      C.struct_ib_uverbs_rereg_mr
	ReregMRResp  C.struct_ib_uverbs_rereg_mr_resp
	DeregMR      C.struct_ib_uverbs_dereg_mr
	AllocMW      C.struct_ib_uverbs_alloc_mw
	AllocMWResp  C.struct_ib_uverbs_alloc_mw_resp
	DeallocMW    C.struct_ib_uverbs_dealloc_mw
)

// Completion channels and completion queues.
type (
	CreateCompChannel     C.struct_ib_uverbs_create_comp_channel
	CreateCompChannelResp C.struct_ib_uverbs_create_comp_channel_resp
	CreateCQ              C.struct_ib_uverbs_create_cq
	CreateCQResp          C.struct_ib_uverbs_create_cq_resp
	ExCreateCQ            C.struct_ib_uverbs_ex_create_cq
	ExCreateCQResp        C.struct_ib_uverbs_ex_create_cq_resp
	ResizeCQ              C.struct_ib_uverbs_resize_cq
	ResizeCQResp          C.struct_ib_uverbs_resize_cq_resp
	PollCQ                C.struct_ib_uverbs_poll_cq
	PollCQResp            C.struct_ib_uverbs_poll_cq_resp
	WC                    C.struct_ib_uverbs_wc
	ReqNotifyCQ           C.struct_ib_uverbs_req_notify_cq
	DestroyCQ             C.struct_ib_uverbs_destroy_cq
	DestroyCQResp         C.struct_ib_uverbs_destroy_cq_resp
	CQModeration          C.struct_ib_uverbs_cq_moderation
	ExModifyCQ            C.struct_ib_uverbs_ex_modify_cq
)

// Queue pairs.
type (
	GlobalRoute     C.struct_ib_uverbs_global_route
	AHAttr          C.struct_ib_uverbs_ah_attr
	QPAttr          C.struct_ib_uverbs_qp_attr
	QPCap           C.struct_ib_uverbs_qp_cap
	CreateQP        C.struct_ib_uverbs_create_qp
	ExCreateQP      C.struct_ib_uverbs_ex_create_qp
	OpenQP          C.struct_ib_uverbs_open_qp
	CreateQPResp    C.struct_ib_uverbs_create_qp_resp
	ExCreateQPResp  C.struct_ib_uverbs_ex_create_qp_resp
	QPDest          C.struct_ib_uverbs_qp_dest
	QueryQP         C.struct_ib_uverbs_query_qp
	QueryQPResp     C.struct_ib_uverbs_query_qp_resp
	ModifyQP        C.struct_ib_uverbs_modify_qp
	ExModifyQP      C.struct_ib_uverbs_ex_modify_qp
	ExModifyQPResp  C.struct_ib_uverbs_ex_modify_qp_resp
	DestroyQP       C.struct_ib_uverbs_destroy_qp
	DestroyQPResp   C.struct_ib_uverbs_destroy_qp_resp
	SGE             C.struct_ib_uverbs_sge
	SendWR          C.struct_ib_uverbs_send_wr
	PostSend        C.struct_ib_uverbs_post_send
	PostSendResp    C.struct_ib_uverbs_post_send_resp
	RecvWR          C.struct_ib_uverbs_recv_wr
	PostRecv        C.struct_ib_uverbs_post_recv
	PostRecvResp    C.struct_ib_uverbs_post_recv_resp
	PostSRQRecv     C.struct_ib_uverbs_post_srq_recv
	PostSRQRecvResp C.struct_ib_uverbs_post_srq_recv_resp
	CreateAH        C.struct_ib_uverbs_create_ah
	CreateAHResp    C.struct_ib_uverbs_create_ah_resp
	DestroyAH       C.struct_ib_uverbs_destroy_ah
	AttachMcast     C.struct_ib_uverbs_attach_mcast
	DetachMcast     C.struct_ib_uverbs_detach_mcast
)

// Shared receive queues, including XRC SRQs.
type (
	CreateSRQ      C.struct_ib_uverbs_create_srq
	CreateXSRQ     C.struct_ib_uverbs_create_xsrq
	CreateSRQResp  C.struct_ib_uverbs_create_srq_resp
	ModifySRQ      C.struct_ib_uverbs_modify_srq
	QuerySRQ       C.struct_ib_uverbs_query_srq
	QuerySRQResp   C.struct_ib_uverbs_query_srq_resp
	DestroySRQ     C.struct_ib_uverbs_destroy_srq
	DestroySRQResp C.struct_ib_uverbs_destroy_srq_resp
)

// ABI version and write commands (enum ib_uverbs_write_cmds).
const (
	ABIVersion = C.IB_USER_VERBS_ABI_VERSION

	CmdGetContext        = C.IB_USER_VERBS_CMD_GET_CONTEXT
	CmdQueryDevice       = C.IB_USER_VERBS_CMD_QUERY_DEVICE
	CmdQueryPort         = C.IB_USER_VERBS_CMD_QUERY_PORT
	CmdAllocPD           = C.IB_USER_VERBS_CMD_ALLOC_PD
	CmdDeallocPD         = C.IB_USER_VERBS_CMD_DEALLOC_PD
	CmdCreateAH          = C.IB_USER_VERBS_CMD_CREATE_AH
	CmdModifyAH          = C.IB_USER_VERBS_CMD_MODIFY_AH
	CmdQueryAH           = C.IB_USER_VERBS_CMD_QUERY_AH
	CmdDestroyAH         = C.IB_USER_VERBS_CMD_DESTROY_AH
	CmdRegMR             = C.IB_USER_VERBS_CMD_REG_MR
	CmdRegSMR            = C.IB_USER_VERBS_CMD_REG_SMR
	CmdReregMR           = C.IB_USER_VERBS_CMD_REREG_MR
	CmdQueryMR           = C.IB_USER_VERBS_CMD_QUERY_MR
	CmdDeregMR           = C.IB_USER_VERBS_CMD_DEREG_MR
	CmdAllocMW           = C.IB_USER_VERBS_CMD_ALLOC_MW
	CmdBindMW            = C.IB_USER_VERBS_CMD_BIND_MW
	CmdDeallocMW         = C.IB_USER_VERBS_CMD_DEALLOC_MW
	CmdCreateCompChannel = C.IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL
	CmdCreateCQ          = C.IB_USER_VERBS_CMD_CREATE_CQ
	CmdResizeCQ          = C.IB_USER_VERBS_CMD_RESIZE_CQ
	CmdDestroyCQ         = C.IB_USER_VERBS_CMD_DESTROY_CQ
	CmdPollCQ            = C.IB_USER_VERBS_CMD_POLL_CQ
	CmdPeekCQ            = C.IB_USER_VERBS_CMD_PEEK_CQ
	CmdReqNotifyCQ       = C.IB_USER_VERBS_CMD_REQ_NOTIFY_CQ
	CmdCreateQP          = C.IB_USER_VERBS_CMD_CREATE_QP
	CmdQueryQP           = C.IB_USER_VERBS_CMD_QUERY_QP
	CmdModifyQP          = C.IB_USER_VERBS_CMD_MODIFY_QP
	CmdDestroyQP         = C.IB_USER_VERBS_CMD_DESTROY_QP
	CmdPostSend          = C.IB_USER_VERBS_CMD_POST_SEND
	CmdPostRecv          = C.IB_USER_VERBS_CMD_POST_RECV
	CmdAttachMcast       = C.IB_USER_VERBS_CMD_ATTACH_MCAST
	CmdDetachMcast       = C.IB_USER_VERBS_CMD_DETACH_MCAST
	CmdCreateSRQ         = C.IB_USER_VERBS_CMD_CREATE_SRQ
	CmdModifySRQ         = C.IB_USER_VERBS_CMD_MODIFY_SRQ
	CmdQuerySRQ          = C.IB_USER_VERBS_CMD_QUERY_SRQ
	CmdDestroySRQ        = C.IB_USER_VERBS_CMD_DESTROY_SRQ
	CmdPostSRQRecv       = C.IB_USER_VERBS_CMD_POST_SRQ_RECV
	CmdOpenXRCD          = C.IB_USER_VERBS_CMD_OPEN_XRCD
	CmdCloseXRCD         = C.IB_USER_VERBS_CMD_CLOSE_XRCD
	CmdCreateXSRQ        = C.IB_USER_VERBS_CMD_CREATE_XSRQ
	CmdOpenQP            = C.IB_USER_VERBS_CMD_OPEN_QP

	CmdThreshold     = C.IB_USER_VERBS_CMD_THRESHOLD
	CmdCommandMask   = C.IB_USER_VERBS_CMD_COMMAND_MASK
	CmdFlagExtended  = C.IB_USER_VERBS_CMD_FLAG_EXTENDED
	ExCmdQueryDevice = C.IB_USER_VERBS_EX_CMD_QUERY_DEVICE
	ExCmdCreateCQ    = C.IB_USER_VERBS_EX_CMD_CREATE_CQ
	ExCmdCreateQP    = C.IB_USER_VERBS_EX_CMD_CREATE_QP
	ExCmdModifyQP    = C.IB_USER_VERBS_EX_CMD_MODIFY_QP
	ExCmdModifyCQ    = C.IB_USER_VERBS_EX_CMD_MODIFY_CQ
)

// Work completion opcodes (enum ib_uverbs_wc_opcode).
const (
	WCSend      = C.IB_UVERBS_WC_SEND
	WCRDMAWrite = C.IB_UVERBS_WC_RDMA_WRITE
	WCRDMARead  = C.IB_UVERBS_WC_RDMA_READ
	WCCompSwap  = C.IB_UVERBS_WC_COMP_SWAP
	WCFetchAdd  = C.IB_UVERBS_WC_FETCH_ADD
	WCBindMW    = C.IB_UVERBS_WC_BIND_MW
	WCLocalInv  = C.IB_UVERBS_WC_LOCAL_INV
	WCTSO       = C.IB_UVERBS_WC_TSO
)

// Work request opcodes (enum ib_uverbs_wr_opcode).
const (
	WRRDMAWrite               = C.IB_UVERBS_WR_RDMA_WRITE
	WRRDMAWriteWithImm        = C.IB_UVERBS_WR_RDMA_WRITE_WITH_IMM
	WRSend                    = C.IB_UVERBS_WR_SEND
	WRSendWithImm             = C.IB_UVERBS_WR_SEND_WITH_IMM
	WRRDMARead                = C.IB_UVERBS_WR_RDMA_READ
	WRAtomicCmpAndSwp         = C.IB_UVERBS_WR_ATOMIC_CMP_AND_SWP
	WRAtomicFetchAndAdd       = C.IB_UVERBS_WR_ATOMIC_FETCH_AND_ADD
	WRLocalInv                = C.IB_UVERBS_WR_LOCAL_INV
	WRBindMW                  = C.IB_UVERBS_WR_BIND_MW
	WRSendWithInv             = C.IB_UVERBS_WR_SEND_WITH_INV
	WRTSO                     = C.IB_UVERBS_WR_TSO
	WRRDMAReadWithInv         = C.IB_UVERBS_WR_RDMA_READ_WITH_INV
	WRMaskedAtomicCmpAndSwp   = C.IB_UVERBS_WR_MASKED_ATOMIC_CMP_AND_SWP
	WRMaskedAtomicFetchAndAdd = C.IB_UVERBS_WR_MASKED_ATOMIC_FETCH_AND_ADD
)

// Memory access flags (enum ib_uverbs_access_flags).
const (
	AccessLocalWrite      = C.IB_UVERBS_ACCESS_LOCAL_WRITE
	AccessRemoteWrite     = C.IB_UVERBS_ACCESS_REMOTE_WRITE
	AccessRemoteRead      = C.IB_UVERBS_ACCESS_REMOTE_READ
	AccessRemoteAtomic    = C.IB_UVERBS_ACCESS_REMOTE_ATOMIC
	AccessMWBind          = C.IB_UVERBS_ACCESS_MW_BIND
	AccessZeroBased       = C.IB_UVERBS_ACCESS_ZERO_BASED
	AccessOnDemand        = C.IB_UVERBS_ACCESS_ON_DEMAND
	AccessHugeTLB         = C.IB_UVERBS_ACCESS_HUGETLB
	AccessRelaxedOrdering = C.IB_UVERBS_ACCESS_RELAXED_ORDERING
	AccessOptionalRange   = C.IB_UVERBS_ACCESS_OPTIONAL_RANGE
)

// SRQ and QP types (enum ib_uverbs_srq_type, enum ib_uverbs_qp_type).
const (
	SRQTBasic = C.IB_UVERBS_SRQT_BASIC
	SRQTXRC   = C.IB_UVERBS_SRQT_XRC
	SRQTTM    = C.IB_UVERBS_SRQT_TM

	QPTRC        = C.IB_UVERBS_QPT_RC
	QPTUC        = C.IB_UVERBS_QPT_UC
	QPTUD        = C.IB_UVERBS_QPT_UD
	QPTRawPacket = C.IB_UVERBS_QPT_RAW_PACKET
	QPTXRCIni    = C.IB_UVERBS_QPT_XRC_INI
	QPTXRCTgt    = C.IB_UVERBS_QPT_XRC_TGT
	QPTDriver    = C.IB_UVERBS_QPT_DRIVER
)

// Device capability flags (enum ib_uverbs_device_cap_flags).
const (
	DeviceResizeMaxWR         = C.IB_UVERBS_DEVICE_RESIZE_MAX_WR
	DeviceBadPkeyCntr         = C.IB_UVERBS_DEVICE_BAD_PKEY_CNTR
	DeviceBadQkeyCntr         = C.IB_UVERBS_DEVICE_BAD_QKEY_CNTR
	DeviceRawMulti            = C.IB_UVERBS_DEVICE_RAW_MULTI
	DeviceAutoPathMig         = C.IB_UVERBS_DEVICE_AUTO_PATH_MIG
	DeviceChangePhyPort       = C.IB_UVERBS_DEVICE_CHANGE_PHY_PORT
	DeviceUDAVPortEnforce     = C.IB_UVERBS_DEVICE_UD_AV_PORT_ENFORCE
	DeviceCurrQPStateMod      = C.IB_UVERBS_DEVICE_CURR_QP_STATE_MOD
	DeviceShutdownPort        = C.IB_UVERBS_DEVICE_SHUTDOWN_PORT
	DevicePortActiveEvent     = C.IB_UVERBS_DEVICE_PORT_ACTIVE_EVENT
	DeviceSysImageGUID        = C.IB_UVERBS_DEVICE_SYS_IMAGE_GUID
	DeviceRCRNRNakGen         = C.IB_UVERBS_DEVICE_RC_RNR_NAK_GEN
	DeviceSRQResize           = C.IB_UVERBS_DEVICE_SRQ_RESIZE
	DeviceNNotifyCQ           = C.IB_UVERBS_DEVICE_N_NOTIFY_CQ
	DeviceMemWindow           = C.IB_UVERBS_DEVICE_MEM_WINDOW
	DeviceUDIPCsum            = C.IB_UVERBS_DEVICE_UD_IP_CSUM
	DeviceXRC                 = C.IB_UVERBS_DEVICE_XRC
	DeviceMemMgtExtensions    = C.IB_UVERBS_DEVICE_MEM_MGT_EXTENSIONS
	DeviceMemWindowType2A     = C.IB_UVERBS_DEVICE_MEM_WINDOW_TYPE_2A
	DeviceMemWindowType2B     = C.IB_UVERBS_DEVICE_MEM_WINDOW_TYPE_2B
	DeviceRCIPCsum            = C.IB_UVERBS_DEVICE_RC_IP_CSUM
	DeviceManagedFlowSteering = C.IB_UVERBS_DEVICE_MANAGED_FLOW_STEERING
)

// Port capability flags (enum ib_uverbs_query_port_cap_flags), a selection.
const (
	PCFSM              = C.IB_UVERBS_PCF_SM
	PCFSysImageGUIDSup = C.IB_UVERBS_PCF_SYS_IMAGE_GUID_SUP
	PCFCMSup           = C.IB_UVERBS_PCF_CM_SUP
	PCFIPBasedGIDs     = C.IB_UVERBS_PCF_IP_BASED_GIDS
	QPFGRHRequired     = C.IB_UVERBS_QPF_GRH_REQUIRED
)

// GID types (enum ib_uverbs_gid_type).
const (
	GIDTypeIB     = C.IB_UVERBS_GID_TYPE_IB
	GIDTypeRoCEv1 = C.IB_UVERBS_GID_TYPE_ROCE_V1
	GIDTypeRoCEv2 = C.IB_UVERBS_GID_TYPE_ROCE_V2
)

// Driver identifiers (enum rdma_driver_id), a selection.
const (
	DriverMLX4 = C.RDMA_DRIVER_MLX4
	DriverRXE  = C.RDMA_DRIVER_RXE
)
