package main

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/hashicorp/go-multierror"
)

// rankFailure is a rank that failed: it exited with a non-zero status or
// was killed by a signal the launcher did not send, or it was lost with
// its node.
type rankFailure struct {
	Rank, Node int
	Host       string
	Code       int    // exit status; -1 for a signal
	Signal     int    // the signal that killed it
	Lost       bool   // it went with its node (the agent failed or went away)
	Detail     string // why, when the agent knows more (it could not start, its node was lost)
	Time       int64  // when it was seen, Unix ns: the first failure is the cause
}

func (f rankFailure) Error() string {
	where := fmt.Sprintf("node %d", f.Node)
	if f.Host != "" {
		where += ", " + f.Host
	}
	var what string
	switch {
	case f.Lost:
		return fmt.Sprintf("rank %d (%s): lost: %s", f.Rank, where, f.Detail)
	case f.Signal > 0:
		what = fmt.Sprintf("killed by signal %d (%s)", f.Signal, syscall.Signal(f.Signal))
	default:
		what = fmt.Sprintf("exit status %d", f.Code)
	}
	if f.Detail != "" {
		what += ": " + f.Detail
	}
	return fmt.Sprintf("rank %d (%s): %s", f.Rank, where, what)
}

// status is the exit status xrcrun takes from this failure: the rank's
// exit status, or 128 plus the signal.
func (f rankFailure) status() int {
	if f.Signal > 0 {
		return 128 + f.Signal
	}
	if f.Code <= 0 || f.Code > 255 {
		return 1
	}
	return f.Code
}

// exitError is an error that sets xrcrun's exit status.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string   { return e.err.Error() }
func (e *exitError) Unwrap() error   { return e.err }
func (e *exitError) ExitStatus() int { return e.code }

// failureReport lists every failed rank, the first to fail first, as one
// error whose exit status is the first one's.
func failureReport(fs []rankFailure) error {
	if len(fs) == 0 {
		return nil
	}
	fs = slices.Clone(fs)
	slices.SortStableFunc(fs, func(a, b rankFailure) int {
		if a.Time != b.Time {
			return cmp.Compare(a.Time, b.Time)
		}
		return a.Rank - b.Rank
	})
	var list *multierror.Error
	for _, f := range fs {
		list = multierror.Append(list, f)
	}
	list.ErrorFormat = func(errs []error) string {
		lines := make([]string, len(errs))
		for i, e := range errs {
			lines[i] = "\t* " + e.Error()
		}
		noun := "ranks"
		if len(errs) == 1 {
			noun = "rank"
		}
		return fmt.Sprintf("%d %s failed:\n%s", len(errs), noun, strings.Join(lines, "\n"))
	}
	return &exitError{code: fs[0].status(), err: list}
}

// signalCause is the cause of the context main cancels on SIGINT or
// SIGTERM.
type signalCause struct{ sig os.Signal }

func (s signalCause) Error() string {
	switch s.sig {
	case syscall.SIGINT:
		return "interrupted (SIGINT)"
	case syscall.SIGTERM:
		return "terminated (SIGTERM)"
	case syscall.SIGHUP:
		return "hung up (SIGHUP)"
	case syscall.SIGPIPE:
		return "output closed (SIGPIPE)"
	}
	return "stopped by signal " + s.sig.String()
}

// ExitStatus is 128 plus the signal, as a shell reports it.
func (s signalCause) ExitStatus() int {
	if n, ok := s.sig.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 1
}
