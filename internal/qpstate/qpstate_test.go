package qpstate

import (
	"errors"
	"syscall"
	"testing"
)

func TestCheck(t *testing.T) {
	rcRTR := AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer
	for _, c := range []struct {
		typ                Type
		cur, next          State
		mask               Mask
		ok                 bool
		missing, extra     Mask
		invalid, curStateE bool
	}{
		{typ: RC, cur: Reset, next: Init, mask: AttrState | AttrPkeyIndex | AttrPort | AttrAccessFlags, ok: true},
		{typ: RC, cur: Reset, next: Init, mask: AttrState | AttrPkeyIndex | AttrAccessFlags, missing: AttrPort},
		{typ: UD, cur: Reset, next: Init, mask: AttrState | AttrPkeyIndex | AttrPort, missing: AttrQkey},
		{typ: RC, cur: Init, next: RTR, mask: AttrState | rcRTR, ok: true},
		{typ: RC, cur: Init, next: RTR, mask: AttrState | rcRTR | AttrSQPSN, extra: AttrSQPSN},
		{typ: XRCIni, cur: Init, next: RTR, mask: AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN, ok: true},
		{typ: XRCIni, cur: Init, next: RTR, mask: AttrState | rcRTR, extra: AttrMaxDestRdAtomic | AttrMinRNRTimer},
		{typ: XRCTgt, cur: RTR, next: RTS, mask: AttrState | AttrTimeout | AttrSQPSN, ok: true},
		{typ: RC, cur: RTR, next: RTS, mask: AttrState | AttrTimeout | AttrSQPSN, missing: AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic},
		{typ: RC, cur: Reset, next: RTS, mask: AttrState, invalid: true},
		{typ: RC, cur: SQE, next: RTS, mask: AttrState, invalid: false, ok: true}, // valid in the table, with no attributes for RC
		{typ: RC, cur: Err, next: Reset, mask: AttrState, ok: true},
		{typ: RC, cur: RTS, next: Err, mask: AttrState, ok: true},
		{typ: RC, cur: Init, next: Init, mask: AttrCurState, curStateE: true},
		{typ: RC, cur: RTS, next: RTS, mask: AttrCurState | AttrMinRNRTimer, ok: true},
		{typ: RC, cur: Init, next: Init, mask: AttrPort, ok: true},
	} {
		err := Check(c.typ, c.cur, c.next, c.mask)
		if c.ok {
			if err != nil {
				t.Errorf("%v %v->%v %v: %v", c.typ, c.cur, c.next, c.mask, err)
			}
			continue
		}
		var te *TransitionError
		if !errors.As(err, &te) || !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%v %v->%v %v: %v, want a TransitionError", c.typ, c.cur, c.next, c.mask, err)
			continue
		}
		if te.Missing != c.missing || te.Extra != c.extra || te.Invalid != c.invalid || te.CurState != c.curStateE {
			t.Errorf("%v %v->%v %v: %+v", c.typ, c.cur, c.next, c.mask, te)
		}
	}
}

func TestErrorText(t *testing.T) {
	err := Check(RC, Init, RTR, AttrState|AttrAV)
	want := "RC QP INIT->RTR: missing required attributes PATH_MTU|RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|DEST_QPN"
	if err == nil || err.Error() != want {
		t.Fatalf("got %q, want %q", err, want)
	}
}
