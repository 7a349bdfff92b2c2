package main

import (
	"context"
	"errors"
	"io"
	"syscall"
	"testing"
)

func TestFailureReport(t *testing.T) {
	if failureReport(nil) != nil {
		t.Error("a report without failures")
	}
	err := failureReport([]rankFailure{
		{Rank: 7, Node: 1, Host: "h2", Code: 1, Time: 30},
		{Rank: 2, Node: 0, Code: -1, Signal: 9, Time: 10},
		{Rank: 4, Node: 1, Host: "h2", Lost: true, Detail: "its node agent went away", Time: 20},
		{Rank: 3, Node: 0, Code: 127, Detail: "start: no such file", Time: 40},
	})
	want := "4 ranks failed:\n" +
		"\t* rank 2 (node 0): killed by signal 9 (killed)\n" +
		"\t* rank 4 (node 1, h2): lost: its node agent went away\n" +
		"\t* rank 7 (node 1, h2): exit status 1\n" +
		"\t* rank 3 (node 0): exit status 127: start: no such file"
	if err == nil || err.Error() != want {
		t.Errorf("got\n%v\nwant\n%s", err, want)
	}
	var st interface{ ExitStatus() int }
	if !errors.As(err, &st) || st.ExitStatus() != 137 {
		t.Errorf("exit status of %v", err)
	}
	if s := (rankFailure{Code: 300}).status(); s != 1 {
		t.Errorf("status of exit code 300: %d", s)
	}
}

// TestBuildInterrupted: a signal while xrcrun builds the program's
// package gives the signal's exit status, as at any other time (it gave 1).
func TestBuildInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(signalCause{syscall.SIGINT})
	_, _, err := buildProgram(ctx, "./testdata/rank", io.Discard)
	var st interface{ ExitStatus() int }
	if !errors.As(err, &st) || st.ExitStatus() != 130 {
		t.Fatalf("build interrupted by SIGINT: %v", err)
	}
}
