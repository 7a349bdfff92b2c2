package verbsx

import "github.com/xrcrun/xrc/verbs"

// Tunables of the QPs.
const (
	InlineSize  = 96 // frames up to this size go inline
	minRNRTimer = 12 // 0.64 ms
	rnrRetry    = 7  // retry forever: RNR is flow control's last resort
	qpTimeout   = 14 // 67 ms
	retryCount  = 7  // transport retries before a QP fails
)

// Dest is the remote end of a QP: the GID and path MTU of its port, its
// QP number and the first PSN it sends with.
type Dest struct {
	GID verbs.GID
	MTU verbs.MTU
	QPN uint32
	PSN uint32
}

// ToInit takes qp to INIT on the core's port, allowing remote reads.
func (c *Core) ToInit(qp *verbs.QP) error {
	return qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: c.port, AccessFlags: verbs.AccessRemoteRead},
		verbs.QPAttrState|verbs.QPAttrPkeyIndex|verbs.QPAttrPort|verbs.QPAttrAccessFlags)
}

// ToRTR takes qp from INIT to RTR toward to. A responder (a QP that
// receives: RC's, XRC's TGT) also gets its RDMA READ and RNR settings; an
// XRC INI QP only sends.
func (c *Core) ToRTR(qp *verbs.QP, to Dest, responder bool) error {
	attr := verbs.QPAttr{State: verbs.QPSRTR, PathMTU: min(c.Port.ActiveMTU, to.MTU), DestQPN: to.QPN, RQPSN: to.PSN,
		AH: verbs.AHAttr{IsGlobal: true, Port: c.port, GRH: verbs.GlobalRoute{DGID: to.GID, HopLimit: 64}}}
	mask := verbs.QPAttrState | verbs.QPAttrAV | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN
	if responder {
		attr.MaxDestRdAtomic, attr.MinRNRTimer = uint8(c.MaxRd), minRNRTimer
		mask |= verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer
	}
	return qp.Modify(&attr, mask)
}

// ToRTS takes qp from RTR to RTS, its first send PSN psn.
func (c *Core) ToRTS(qp *verbs.QP, psn uint32) error {
	return qp.Modify(&verbs.QPAttr{State: verbs.QPSRTS, Timeout: qpTimeout, RetryCnt: retryCount,
		RNRRetry: rnrRetry, SQPSN: psn, MaxRdAtomic: uint8(c.MaxRd)},
		verbs.QPAttrState|verbs.QPAttrTimeout|verbs.QPAttrRetryCnt|verbs.QPAttrRNRRetry|
			verbs.QPAttrSQPSN|verbs.QPAttrMaxQPRdAtomic)
}
