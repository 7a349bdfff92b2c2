package verbs

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/xrcrun/xrc/internal/qpstate"
)

// Access flags of memory regions and QPs (enum ibv_access_flags).
type Access uint32

// Access flags.
const (
	AccessLocalWrite   Access = 1 << 0
	AccessRemoteWrite  Access = 1 << 1
	AccessRemoteRead   Access = 1 << 2
	AccessRemoteAtomic Access = 1 << 3
)

func (a Access) String() string {
	if a == 0 {
		return "none"
	}
	var p []string
	for _, f := range []struct {
		bit  Access
		name string
	}{{AccessLocalWrite, "LOCAL_WRITE"}, {AccessRemoteWrite, "REMOTE_WRITE"}, {AccessRemoteRead, "REMOTE_READ"}, {AccessRemoteAtomic, "REMOTE_ATOMIC"}} {
		if a&f.bit != 0 {
			p = append(p, f.name)
			a &^= f.bit
		}
	}
	if a != 0 {
		p = append(p, fmt.Sprintf("%#x", uint32(a)))
	}
	return strings.Join(p, "|")
}

// GID is a 128-bit global identifier; for RoCE it is derived from the port's
// IP address (an IPv4-mapped IPv6 address for IPv4).
type GID [16]byte

// Addr returns the GID as an IP address (unmapped for IPv4).
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

// GIDFromAddr returns the RoCEv2 GID of an IP address.
func GIDFromAddr(a netip.Addr) GID { return GID(a.As16()) }

func (g GID) String() string {
	var b strings.Builder
	for i := 0; i < 16; i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		fmt.Fprintf(&b, "%02x%02x", g[i], g[i+1])
	}
	return b.String()
}

// MTU is a path MTU (enum ibv_mtu).
type MTU uint8

// Path MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes, or 0 for an invalid value.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

func (m MTU) String() string {
	if b := m.Bytes(); b != 0 {
		return fmt.Sprint(b)
	}
	return fmt.Sprintf("MTU(%d)", uint8(m))
}

// MTUFromBytes returns the MTU enum of a size in bytes.
func MTUFromBytes(n int) (MTU, error) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, nil
		}
	}
	return 0, fmt.Errorf("invalid MTU %d: must be 256, 512, 1024, 2048 or 4096", n)
}

// DeviceAttr holds what QueryDevice reports (struct ibv_device_attr).
type DeviceAttr struct {
	FwVer           string
	NodeGUID        uint64
	SysImageGUID    uint64
	MaxMRSize       uint64
	PageSizeCap     uint64
	VendorID        uint32
	VendorPartID    uint32
	HWVer           uint32
	MaxQP           uint32
	MaxQPWR         uint32
	DeviceCapFlags  DeviceCap
	MaxSGE          uint32
	MaxSGERd        uint32
	MaxCQ           uint32
	MaxCQE          uint32
	MaxMR           uint32
	MaxPD           uint32
	MaxQPRdAtom     uint32
	MaxResRdAtom    uint32
	MaxQPInitRdAtom uint32
	AtomicCap       AtomicCap
	MaxSRQ          uint32
	MaxSRQWR        uint32
	MaxSRQSGE       uint32
	MaxPkeys        uint16
	LocalCAAckDelay uint8
	PhysPortCnt     uint8
}

// DeviceCap is the device capability mask (enum ib_uverbs_device_cap_flags).
type DeviceCap uint64

// Device capabilities used by this package.
const (
	DeviceCapResizeMaxWR      DeviceCap = 1 << 0
	DeviceCapBadPkeyCntr      DeviceCap = 1 << 1
	DeviceCapBadQkeyCntr      DeviceCap = 1 << 2
	DeviceCapChangePhyPort    DeviceCap = 1 << 5
	DeviceCapUDAVPortEnforce  DeviceCap = 1 << 6
	DeviceCapCurrQPStateMod   DeviceCap = 1 << 7
	DeviceCapShutdownPort     DeviceCap = 1 << 8
	DeviceCapPortActiveEvent  DeviceCap = 1 << 10
	DeviceCapSysImageGUID     DeviceCap = 1 << 11
	DeviceCapRCRNRNakGen      DeviceCap = 1 << 12
	DeviceCapSRQResize        DeviceCap = 1 << 13
	DeviceCapNNotifyCQ        DeviceCap = 1 << 14
	DeviceCapMemWindow        DeviceCap = 1 << 17
	DeviceCapXRC              DeviceCap = 1 << 20
	DeviceCapMemMgtExtensions DeviceCap = 1 << 21
)

var deviceCapNames = map[DeviceCap]string{
	DeviceCapResizeMaxWR: "RESIZE_MAX_WR", DeviceCapBadPkeyCntr: "BAD_PKEY_CNTR",
	DeviceCapBadQkeyCntr: "BAD_QKEY_CNTR", DeviceCapChangePhyPort: "CHANGE_PHY_PORT",
	DeviceCapUDAVPortEnforce: "UD_AV_PORT_ENFORCE", DeviceCapCurrQPStateMod: "CURR_QP_STATE_MOD",
	DeviceCapShutdownPort: "SHUTDOWN_PORT", DeviceCapPortActiveEvent: "PORT_ACTIVE_EVENT",
	DeviceCapSysImageGUID: "SYS_IMAGE_GUID", DeviceCapRCRNRNakGen: "RC_RNR_NAK_GEN",
	DeviceCapSRQResize: "SRQ_RESIZE", DeviceCapNNotifyCQ: "N_NOTIFY_CQ", DeviceCapMemWindow: "MEM_WINDOW",
	DeviceCapXRC: "XRC", DeviceCapMemMgtExtensions: "MEM_MGT_EXTENSIONS",
	// The other flags of enum ibv_device_cap_flags, which this package
	// does not use but ibv_devinfo names.
	1 << 3: "RAW_MULTI", 1 << 4: "AUTO_PATH_MIG", 1 << 9: "INIT_TYPE", 1 << 18: "UD_IP_CSUM",
	1 << 23: "MEM_WINDOW_TYPE_2A", 1 << 24: "MEM_WINDOW_TYPE_2B", 1 << 25: "RC_IP_CSUM", 1 << 26: "RAW_IP_CSUM",
	1 << 29: "MANAGED_FLOW_STEERING",
}

// Names lists the set flags by their ibv_devinfo names, in bit order, and
// then, as ibv_devinfo does, the flags without a name in one
// "Unknown flags: 0x…" entry.
func (c DeviceCap) Names() []string {
	var out []string
	var unknown DeviceCap
	for bit := DeviceCap(1); bit != 0; bit <<= 1 {
		if c&bit == 0 {
			continue
		}
		if n, ok := deviceCapNames[bit]; ok {
			out = append(out, n)
		} else {
			unknown |= bit
		}
	}
	if unknown != 0 {
		out = append(out, fmt.Sprintf("Unknown flags: 0x%X", uint64(unknown)))
	}
	return out
}

// AtomicCap is the device's atomic guarantee (enum ibv_atomic_cap).
type AtomicCap uint32

// Atomic capabilities.
const (
	AtomicNone AtomicCap = 0
	AtomicHCA  AtomicCap = 1 // atomic with respect to this HCA's other atomics
	AtomicGlob AtomicCap = 2 // atomic with respect to the CPUs too
)

// PortState is the logical state of a port (enum ibv_port_state).
type PortState uint8

// Port states.
const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

func (s PortState) String() string {
	switch s {
	case PortNop:
		return "PORT_NOP"
	case PortDown:
		return "PORT_DOWN"
	case PortInit:
		return "PORT_INIT"
	case PortArmed:
		return "PORT_ARMED"
	case PortActive:
		return "PORT_ACTIVE"
	case PortActiveDefer:
		return "PORT_ACTIVE_DEFER"
	}
	return fmt.Sprintf("PortState(%d)", uint8(s))
}

// LinkLayer of a port.
type LinkLayer uint8

// Link layers.
const (
	LinkLayerUnspecified LinkLayer = 0
	LinkLayerInfiniBand  LinkLayer = 1
	LinkLayerEthernet    LinkLayer = 2
)

func (l LinkLayer) String() string {
	switch l {
	case LinkLayerInfiniBand:
		return "InfiniBand"
	case LinkLayerEthernet:
		return "Ethernet"
	}
	return "Unspecified"
}

// PortAttr holds what QueryPort reports (struct ibv_port_attr).
type PortAttr struct {
	State         PortState
	MaxMTU        MTU
	ActiveMTU     MTU
	GIDTblLen     uint32
	PortCapFlags  uint32
	MaxMsgSz      uint32
	BadPkeyCntr   uint32
	QkeyViolCntr  uint32
	PkeyTblLen    uint16
	LID           uint16
	SMLID         uint16
	LMC           uint8
	MaxVLNum      uint8
	SMSL          uint8
	SubnetTimeout uint8
	ActiveWidth   uint8
	ActiveSpeed   uint8
	PhysState     uint8
	LinkLayer     LinkLayer
	Flags         uint8
	// GID is the port's GID at index 0 (for RoCE, from its IP address).
	GID GID
}

// QPState is a QP state.
type QPState = qpstate.State

// QP states.
const (
	QPSReset = qpstate.Reset
	QPSInit  = qpstate.Init
	QPSRTR   = qpstate.RTR
	QPSRTS   = qpstate.RTS
	QPSSQD   = qpstate.SQD
	QPSSQE   = qpstate.SQE
	QPSErr   = qpstate.Err
)

// QPType is a QP transport type.
type QPType = qpstate.Type

// QP types.
const (
	QPTRC     = qpstate.RC
	QPTUC     = qpstate.UC
	QPTUD     = qpstate.UD
	QPTXRCIni = qpstate.XRCIni
	QPTXRCTgt = qpstate.XRCTgt
)

// QPAttrMask selects the attributes of a Modify or Query.
type QPAttrMask = qpstate.Mask

// QP attribute mask bits.
const (
	QPAttrState            = qpstate.AttrState
	QPAttrCurState         = qpstate.AttrCurState
	QPAttrEnSQDAsyncNotify = qpstate.AttrEnSQDAsyncNotify
	QPAttrAccessFlags      = qpstate.AttrAccessFlags
	QPAttrPkeyIndex        = qpstate.AttrPkeyIndex
	QPAttrPort             = qpstate.AttrPort
	QPAttrQkey             = qpstate.AttrQkey
	QPAttrAV               = qpstate.AttrAV
	QPAttrPathMTU          = qpstate.AttrPathMTU
	QPAttrTimeout          = qpstate.AttrTimeout
	QPAttrRetryCnt         = qpstate.AttrRetryCnt
	QPAttrRNRRetry         = qpstate.AttrRNRRetry
	QPAttrRQPSN            = qpstate.AttrRQPSN
	QPAttrMaxQPRdAtomic    = qpstate.AttrMaxQPRdAtomic
	QPAttrAltPath          = qpstate.AttrAltPath
	QPAttrMinRNRTimer      = qpstate.AttrMinRNRTimer
	QPAttrSQPSN            = qpstate.AttrSQPSN
	QPAttrMaxDestRdAtomic  = qpstate.AttrMaxDestRdAtomic
	QPAttrPathMigState     = qpstate.AttrPathMigState
	QPAttrCap              = qpstate.AttrCap
	QPAttrDestQPN          = qpstate.AttrDestQPN
)

// TransitionError is returned by QP.Modify for a transition the state
// machine does not allow; it names the missing or unexpected attributes.
// It matches syscall.EINVAL with errors.Is.
type TransitionError = qpstate.TransitionError

// GlobalRoute is the GRH part of an address vector; RoCE always uses it.
type GlobalRoute struct {
	DGID         GID
	FlowLabel    uint32
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
}

// AHAttr is an address vector: where a connected QP sends.
type AHAttr struct {
	GRH         GlobalRoute
	DLID        uint16
	SL          uint8
	SrcPathBits uint8
	StaticRate  uint8
	IsGlobal    bool
	Port        uint8
}

// QPCap gives the sizes of a QP's queues.
type QPCap struct {
	MaxSendWR     uint32
	MaxRecvWR     uint32
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInlineData uint32
}

// QPAttr holds QP attributes for Modify and Query (struct ibv_qp_attr).
type QPAttr struct {
	State            QPState
	CurState         QPState
	PathMTU          MTU
	PathMigState     uint8
	Qkey             uint32
	RQPSN            uint32
	SQPSN            uint32
	DestQPN          uint32
	AccessFlags      Access
	Cap              QPCap
	AH               AHAttr
	AltAH            AHAttr
	PkeyIndex        uint16
	AltPkeyIndex     uint16
	EnSQDAsyncNotify bool
	SQDraining       bool
	MaxRdAtomic      uint8
	MaxDestRdAtomic  uint8
	MinRNRTimer      uint8
	Port             uint8
	Timeout          uint8
	RetryCnt         uint8
	RNRRetry         uint8
	AltPort          uint8
	AltTimeout       uint8
}

// QPInitAttr describes a QP to create (struct ibv_qp_init_attr).
type QPInitAttr struct {
	Type   QPType
	SendCQ *CQ
	RecvCQ *CQ
	SRQ    *SRQ // receives come from this SRQ instead of a receive queue
	Cap    QPCap
	SigAll bool // every send request generates a completion
}

// SRQAttr holds SRQ attributes (struct ibv_srq_attr).
type SRQAttr struct {
	MaxWR    uint32
	MaxSGE   uint32
	SRQLimit uint32
}

// SRQAttrMask selects the attributes of SRQ.Modify.
type SRQAttrMask uint32

// SRQ attribute mask bits.
const (
	SRQMaxWR SRQAttrMask = 1 << 0 // resize (needs DeviceCapSRQResize)
	SRQLimit SRQAttrMask = 1 << 1 // arm the limit event
)
