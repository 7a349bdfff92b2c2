// Package qpstate holds the InfiniBand queue pair state machine: the states,
// the QP types, the attribute mask bits, and the table of which attributes a
// transition requires and which it allows, per QP type. It mirrors the Linux
// kernel's qp_state_table (drivers/infiniband/core/verbs.c), so that the
// verbs API can explain an EINVAL before asking the device, and the software
// HCA can reject a transition exactly as the kernel would.
package qpstate

import (
	"fmt"
	"strings"
	"syscall"
)

// State is a QP state (enum ib_qp_state).
type State uint8

// QP states.
const (
	Reset State = iota
	Init
	RTR
	RTS
	SQD
	SQE
	Err
	numStates
)

var stateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

func (s State) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Valid reports whether s is one of the seven states.
func (s State) Valid() bool { return s < numStates }

// Type is a QP transport type (enum ib_uverbs_qp_type).
type Type uint8

// QP types.
const (
	RC     Type = 2
	UC     Type = 3
	UD     Type = 4
	XRCIni Type = 9  // XRC send (initiator) QP
	XRCTgt Type = 10 // XRC receive (target) QP
)

func (t Type) String() string {
	switch t {
	case RC:
		return "RC"
	case UC:
		return "UC"
	case UD:
		return "UD"
	case XRCIni:
		return "XRC_INI"
	case XRCTgt:
		return "XRC_TGT"
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// Mask selects QP attributes in a modify or query (enum ib_qp_attr_mask).
type Mask uint32

// Attribute mask bits.
const (
	AttrState            Mask = 1 << 0
	AttrCurState         Mask = 1 << 1
	AttrEnSQDAsyncNotify Mask = 1 << 2
	AttrAccessFlags      Mask = 1 << 3
	AttrPkeyIndex        Mask = 1 << 4
	AttrPort             Mask = 1 << 5
	AttrQkey             Mask = 1 << 6
	AttrAV               Mask = 1 << 7
	AttrPathMTU          Mask = 1 << 8
	AttrTimeout          Mask = 1 << 9
	AttrRetryCnt         Mask = 1 << 10
	AttrRNRRetry         Mask = 1 << 11
	AttrRQPSN            Mask = 1 << 12
	AttrMaxQPRdAtomic    Mask = 1 << 13
	AttrAltPath          Mask = 1 << 14
	AttrMinRNRTimer      Mask = 1 << 15
	AttrSQPSN            Mask = 1 << 16
	AttrMaxDestRdAtomic  Mask = 1 << 17
	AttrPathMigState     Mask = 1 << 18
	AttrCap              Mask = 1 << 19
	AttrDestQPN          Mask = 1 << 20
	AttrRateLimit        Mask = 1 << 25
)

var maskNames = map[Mask]string{
	AttrState: "STATE", AttrCurState: "CUR_STATE", AttrEnSQDAsyncNotify: "EN_SQD_ASYNC_NOTIFY",
	AttrAccessFlags: "ACCESS_FLAGS", AttrPkeyIndex: "PKEY_INDEX", AttrPort: "PORT", AttrQkey: "QKEY",
	AttrAV: "AV", AttrPathMTU: "PATH_MTU", AttrTimeout: "TIMEOUT", AttrRetryCnt: "RETRY_CNT",
	AttrRNRRetry: "RNR_RETRY", AttrRQPSN: "RQ_PSN", AttrMaxQPRdAtomic: "MAX_QP_RD_ATOMIC",
	AttrAltPath: "ALT_PATH", AttrMinRNRTimer: "MIN_RNR_TIMER", AttrSQPSN: "SQ_PSN",
	AttrMaxDestRdAtomic: "MAX_DEST_RD_ATOMIC", AttrPathMigState: "PATH_MIG_STATE", AttrCap: "CAP",
	AttrDestQPN: "DEST_QPN", AttrRateLimit: "RATE_LIMIT",
}

// String lists the attributes of m, as "PATH_MTU|DEST_QPN".
func (m Mask) String() string {
	if m == 0 {
		return "none"
	}
	var parts []string
	for bit := Mask(1); bit != 0; bit <<= 1 {
		if m&bit == 0 {
			continue
		}
		if n, ok := maskNames[bit]; ok {
			parts = append(parts, n)
		} else {
			parts = append(parts, fmt.Sprintf("%#x", uint32(bit)))
		}
	}
	return strings.Join(parts, "|")
}

// transition is one entry of the table: the attributes a transition requires
// and those it allows, per QP type.
type transition struct {
	req, opt map[Type]Mask
}

// table[cur][next]; a nil entry is an invalid transition. Transitions to
// RESET and ERR are valid from every state and take no attributes.
var table [numStates][numStates]*transition

func init() {
	any := &transition{}
	for s := range numStates {
		table[s][Reset] = any
		table[s][Err] = any
	}
	table[Reset][Init] = &transition{req: map[Type]Mask{
		UD:     AttrPkeyIndex | AttrPort | AttrQkey,
		UC:     AttrPkeyIndex | AttrPort | AttrAccessFlags,
		RC:     AttrPkeyIndex | AttrPort | AttrAccessFlags,
		XRCIni: AttrPkeyIndex | AttrPort | AttrAccessFlags,
		XRCTgt: AttrPkeyIndex | AttrPort | AttrAccessFlags,
	}}
	table[Init][Init] = &transition{opt: map[Type]Mask{
		UD:     AttrPkeyIndex | AttrPort | AttrQkey,
		UC:     AttrPkeyIndex | AttrPort | AttrAccessFlags,
		RC:     AttrPkeyIndex | AttrPort | AttrAccessFlags,
		XRCIni: AttrPkeyIndex | AttrPort | AttrAccessFlags,
		XRCTgt: AttrPkeyIndex | AttrPort | AttrAccessFlags,
	}}
	rtrRC := AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer
	rtrOpt := AttrAltPath | AttrAccessFlags | AttrPkeyIndex
	table[Init][RTR] = &transition{
		req: map[Type]Mask{
			UC:     AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
			RC:     rtrRC,
			XRCIni: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
			XRCTgt: rtrRC,
		},
		opt: map[Type]Mask{
			UD: AttrPkeyIndex | AttrQkey, UC: rtrOpt, RC: rtrOpt, XRCIni: rtrOpt, XRCTgt: rtrOpt,
		},
	}
	rtsReq := AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrSQPSN | AttrMaxQPRdAtomic
	table[RTR][RTS] = &transition{
		req: map[Type]Mask{
			UD: AttrSQPSN, UC: AttrSQPSN, RC: rtsReq, XRCIni: rtsReq,
			XRCTgt: AttrTimeout | AttrSQPSN,
		},
		opt: map[Type]Mask{
			UD:     AttrCurState | AttrQkey,
			UC:     AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState,
			RC:     AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState,
			XRCIni: AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState,
			XRCTgt: AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState,
		},
	}
	rtsOpt := map[Type]Mask{
		UD:     AttrCurState | AttrQkey,
		UC:     AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState,
		RC:     AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState | AttrMinRNRTimer,
		XRCIni: AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState,
		XRCTgt: AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState | AttrMinRNRTimer,
	}
	table[RTS][RTS] = &transition{opt: rtsOpt}
	table[RTS][SQD] = &transition{opt: map[Type]Mask{
		UD: AttrEnSQDAsyncNotify, UC: AttrEnSQDAsyncNotify, RC: AttrEnSQDAsyncNotify,
		XRCIni: AttrEnSQDAsyncNotify, XRCTgt: AttrEnSQDAsyncNotify,
	}}
	table[SQD][RTS] = &transition{opt: rtsOpt}
	table[SQD][SQD] = &transition{opt: map[Type]Mask{
		UD: AttrPkeyIndex | AttrQkey,
		UC: AttrAV | AttrAltPath | AttrAccessFlags | AttrPkeyIndex | AttrPathMigState,
		RC: AttrPort | AttrAV | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic |
			AttrMaxDestRdAtomic | AttrAltPath | AttrAccessFlags | AttrPkeyIndex | AttrMinRNRTimer |
			AttrPathMigState,
		XRCIni: AttrPort | AttrAV | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic |
			AttrAltPath | AttrAccessFlags | AttrPkeyIndex | AttrPathMigState,
		XRCTgt: AttrPort | AttrAV | AttrTimeout | AttrMaxDestRdAtomic | AttrAltPath | AttrAccessFlags |
			AttrPkeyIndex | AttrMinRNRTimer | AttrPathMigState,
	}}
	table[SQE][RTS] = &transition{opt: map[Type]Mask{
		UD: AttrCurState | AttrQkey,
		UC: AttrCurState | AttrAccessFlags,
	}}
}

// TransitionError explains why a modify is not allowed: the transition
// itself is invalid, or attributes are missing or not allowed.
type TransitionError struct {
	Type     Type
	Cur      State
	Next     State
	Invalid  bool // no such transition for any attributes
	Missing  Mask // required attributes not given
	Extra    Mask // given attributes the transition does not allow
	CurState bool // CUR_STATE given in a state that does not accept it
}

func (e *TransitionError) Error() string {
	prefix := fmt.Sprintf("%s QP %s->%s", e.Type, e.Cur, e.Next)
	switch {
	case e.Invalid:
		return prefix + ": invalid state transition"
	case e.CurState:
		return prefix + ": CUR_STATE may only be given in RTR, RTS, SQD or SQE"
	}
	var parts []string
	if e.Missing != 0 {
		parts = append(parts, "missing required attributes "+e.Missing.String())
	}
	if e.Extra != 0 {
		parts = append(parts, "attributes not allowed "+e.Extra.String())
	}
	return prefix + ": " + strings.Join(parts, "; ")
}

// Unwrap makes a TransitionError match EINVAL, the kernel's answer to it.
func (e *TransitionError) Unwrap() error { return syscall.EINVAL }

// Check tells whether a QP of type typ in state cur may move to next with
// the attributes in mask (AttrState is implied). It returns nil or a
// *TransitionError, following ib_modify_qp_is_ok.
func Check(typ Type, cur, next State, mask Mask) error {
	if !cur.Valid() || !next.Valid() {
		return &TransitionError{Type: typ, Cur: cur, Next: next, Invalid: true}
	}
	if mask&AttrCurState != 0 && cur != RTR && cur != RTS && cur != SQD && cur != SQE {
		return &TransitionError{Type: typ, Cur: cur, Next: next, CurState: true}
	}
	tr := table[cur][next]
	if tr == nil {
		return &TransitionError{Type: typ, Cur: cur, Next: next, Invalid: true}
	}
	req, opt := tr.req[typ], tr.opt[typ]
	missing := req &^ mask
	extra := mask &^ (req | opt | AttrState)
	if missing != 0 || extra != 0 {
		return &TransitionError{Type: typ, Cur: cur, Next: next, Missing: missing, Extra: extra}
	}
	return nil
}

// Required returns the attributes a transition requires for typ.
func Required(typ Type, cur, next State) Mask {
	if !cur.Valid() || !next.Valid() || table[cur][next] == nil {
		return 0
	}
	return table[cur][next].req[typ]
}
