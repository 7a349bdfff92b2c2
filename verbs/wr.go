package verbs

import "fmt"

// SGE is a scatter/gather element: Length bytes at Addr in the memory region
// whose local key is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// WROpcode is the operation of a send work request (enum ibv_wr_opcode).
type WROpcode uint32

// Send work request opcodes.
const (
	WRRDMAWrite        WROpcode = 0
	WRRDMAWriteWithImm WROpcode = 1
	WRSend             WROpcode = 2
	WRSendWithImm      WROpcode = 3
	WRRDMARead         WROpcode = 4
	WRAtomicCmpAndSwp  WROpcode = 5
	WRAtomicFetchAdd   WROpcode = 6
)

var wrOpcodeNames = [...]string{"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM", "RDMA_READ", "ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD"}

func (o WROpcode) String() string {
	if int(o) < len(wrOpcodeNames) {
		return wrOpcodeNames[o]
	}
	return fmt.Sprintf("WROpcode(%d)", uint32(o))
}

// SendFlags modify a send work request (enum ibv_send_flags).
type SendFlags uint32

// Send flags.
const (
	SendFence     SendFlags = 1 << 0 // wait for prior RDMA READs and atomics
	SendSignaled  SendFlags = 1 << 1 // generate a completion
	SendSolicited SendFlags = 1 << 2 // set the solicited event bit
	SendInline    SendFlags = 1 << 3 // copy the data into the work request at post time
)

// SendWR is a send work request. The memory its SG list names belongs to the
// device from PostSend until the request's completion is polled (or, for an
// unsignaled request, until a later request's completion is); inline data is
// copied at post time and the buffer is free when PostSend returns.
type SendWR struct {
	WRID       uint64
	Next       *SendWR // further requests posted in the same call
	SG         []SGE
	Opcode     WROpcode
	Flags      SendFlags
	Imm        uint32 // immediate data, host order (big-endian on the wire)
	RemoteAddr uint64 // RDMA and atomic target address
	RKey       uint32 // RDMA and atomic target key
	CompareAdd uint64 // compare value (CMP_AND_SWP) or addend (FETCH_ADD)
	Swap       uint64 // swap value (CMP_AND_SWP)
	// RemoteSRQNum names the target XRC SRQ on XRC send QPs.
	RemoteSRQNum uint32
}

// RecvWR is a receive work request. Its buffers belong to the device until
// the request's completion is polled.
type RecvWR struct {
	WRID uint64
	Next *RecvWR
	SG   []SGE
}

// WCStatus is the status of a work completion (enum ibv_wc_status).
type WCStatus uint32

// Work completion statuses.
const (
	WCSuccess           WCStatus = 0
	WCLocLenErr         WCStatus = 1
	WCLocQPOpErr        WCStatus = 2
	WCLocEECOpErr       WCStatus = 3
	WCLocProtErr        WCStatus = 4
	WCWRFlushErr        WCStatus = 5
	WCMWBindErr         WCStatus = 6
	WCBadRespErr        WCStatus = 7
	WCLocAccessErr      WCStatus = 8
	WCRemInvReqErr      WCStatus = 9
	WCRemAccessErr      WCStatus = 10
	WCRemOpErr          WCStatus = 11
	WCRetryExcErr       WCStatus = 12
	WCRNRRetryExcErr    WCStatus = 13
	WCLocRDDViolErr     WCStatus = 14
	WCRemInvRdReqErr    WCStatus = 15
	WCRemAbortErr       WCStatus = 16
	WCInvEECNErr        WCStatus = 17
	WCInvEECStateErr    WCStatus = 18
	WCFatalErr          WCStatus = 19
	WCRespTimeoutErr    WCStatus = 20
	WCGeneralErr        WCStatus = 21
	numWCStatus                  = 22
	wcStatusNameUnknown          = "unknown"
)

var wcStatusNames = [numWCStatus]string{
	"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR", "WR_FLUSH_ERR",
	"MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR",
	"REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR",
	"REM_ABORT_ERR", "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR",
}

// Error makes a status an error, so that a failed work request's error
// can wrap its status for errors.Is (errors.Is(err, verbs.WCRetryExcErr)).
// WCSuccess is no error: callers wrap only a status that is not.
func (s WCStatus) Error() string { return s.String() }

func (s WCStatus) String() string {
	if s < numWCStatus {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("WCStatus(%d)", uint32(s))
}

// WCOpcode is the operation a work completion reports (enum ibv_wc_opcode).
type WCOpcode uint32

// Work completion opcodes.
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCBindMW          WCOpcode = 5
	WCLocalInv        WCOpcode = 6
	WCRecv            WCOpcode = 128 // receive of a SEND
	WCRecvRDMAWithImm WCOpcode = 129 // receive of an RDMA WRITE with immediate
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCCompSwap:
		return "COMP_SWAP"
	case WCFetchAdd:
		return "FETCH_ADD"
	case WCBindMW:
		return "BIND_MW"
	case WCLocalInv:
		return "LOCAL_INV"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint32(o))
}

// WCFlags qualify a work completion (enum ibv_wc_flags).
type WCFlags uint32

// Work completion flags.
const (
	WCWithGRH WCFlags = 1 << 0
	WCWithImm WCFlags = 1 << 1
	WCWithInv WCFlags = 1 << 3
)

// WorkCompletion is one polled completion. For an error status only WRID,
// Status, QPNum and VendorErr are defined, as in ibverbs.
type WorkCompletion struct {
	WRID         uint64
	Status       WCStatus
	Opcode       WCOpcode
	VendorErr    uint32
	ByteLen      uint32
	Imm          uint32 // immediate data (with WCWithImm), host order
	QPNum        uint32 // the local QP (for XRC receives, the TGT QP)
	SrcQP        uint32 // the remote QP of a receive
	Flags        WCFlags
	PkeyIndex    uint16
	SLID         uint16
	SL           uint8
	DLIDPathBits uint8
}
