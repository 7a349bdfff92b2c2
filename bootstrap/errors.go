package bootstrap

import (
	"errors"
	"fmt"
)

// Errors that returned errors wrap; match them with errors.Is.
var (
	// ErrAborted: the job was aborted by a rank, by the launcher, or
	// because a rank was lost. The error is an *AbortError, except for a
	// Join that the server refused because the job was aborted before:
	// that one carries the server's description only.
	ErrAborted = errors.New("bootstrap: job aborted")
	// ErrAuth: the peer did not prove that it holds the job's key (a
	// client with a wrong key, or a server that is not the job's).
	ErrAuth = errors.New("bootstrap: authentication failed")
	// ErrProtocol: a message was oversized, truncated, garbled, of an
	// unknown type or version, or out of place.
	ErrProtocol = errors.New("bootstrap: protocol error")
	// ErrClosed: the client or server was closed.
	ErrClosed = errors.New("bootstrap: closed")
	// ErrLost: the connection to the server broke (the server closed or
	// died, or a send failed midway), or Join could not connect to it.
	ErrLost = errors.New("bootstrap: lost the connection to the server")
	// ErrRejected: the server refused the registration (a rank out of
	// range, a rank already registered, a different job size).
	ErrRejected = errors.New("bootstrap: registration rejected")
	// ErrKeyExists: Put of a key that already holds a different value.
	ErrKeyExists = errors.New("bootstrap: key already holds a different value")
)

// AbortError is the error of an aborted job. errors.Is(err, ErrAborted)
// holds for it.
type AbortError struct {
	Rank   int    // the rank that aborted or was lost; -1 for the launcher (the server)
	Lost   bool   // Rank's connection ended before it closed its client
	Blamed bool   // the server aborted the job over Rank's requests; Rank did not call Abort
	Reason string // the reason given to Abort, or why the rank was lost or blamed
}

func (e *AbortError) Error() string {
	switch {
	case e.Rank < 0:
		return fmt.Sprintf("bootstrap: job aborted by the launcher: %s", e.Reason)
	case e.Lost:
		return fmt.Sprintf("bootstrap: job aborted: rank %d was lost: %s", e.Rank, e.Reason)
	case e.Blamed:
		return fmt.Sprintf("bootstrap: job aborted because of rank %d: %s", e.Rank, e.Reason)
	default:
		return fmt.Sprintf("bootstrap: job aborted by rank %d: %s", e.Rank, e.Reason)
	}
}

// Is makes errors.Is(e, ErrAborted) true.
func (e *AbortError) Is(target error) bool { return target == ErrAborted }

// badMessage is a protocol error with a reason for the bad-message metric.
type badMessage struct {
	reason string // a metric label: too_large, unknown_type, truncated, malformed, version, unexpected
	msg    string
}

func (e *badMessage) Error() string        { return "bootstrap: protocol error: " + e.msg }
func (e *badMessage) Is(target error) bool { return target == ErrProtocol }

func protoErr(reason, format string, args ...any) error {
	return &badMessage{reason: reason, msg: fmt.Sprintf(format, args...)}
}
