package verbs

import (
	"errors"
	"fmt"
	"testing"
)

// TestStatusErrors: a failed work completion's status and a failing
// async event's type are errors that a wrapping error matches with
// errors.Is, and print as their names.
func TestStatusErrors(t *testing.T) {
	err := fmt.Errorf("rc: rank 1: send completion: %w", WCRetryExcErr)
	if !errors.Is(err, WCRetryExcErr) || errors.Is(err, WCRNRRetryExcErr) {
		t.Errorf("%v: errors.Is does not tell the status", err)
	}
	if got := err.Error(); got != "rc: rank 1: send completion: RETRY_EXC_ERR" {
		t.Errorf("error %q", got)
	}
	err = fmt.Errorf("QP failed: %w", EventQPAccessErr)
	if !errors.Is(err, EventQPAccessErr) || errors.Is(err, EventQPFatal) || err.Error() != "QP failed: QP_ACCESS_ERR" {
		t.Errorf("%v: errors.Is does not tell the event", err)
	}
}
