package main

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xrcrun/xrc/bootstrap"
)

// blameJob is a job of 8 ranks on 2 nodes whose loop state the test drives
// through message, as the loop does.
func blameJob(served error) *job {
	j := &job{id: "j1", cfg: &launchConfig{grace: time.Second}, log: slog.New(slog.DiscardHandler)}
	for k := range 2 {
		j.place.Nodes = append(j.place.Nodes, node{})
		var rs []int
		for range 4 {
			rs = append(rs, len(j.place.Node))
			j.place.Node = append(j.place.Node, k)
		}
		j.place.Ranks = append(j.place.Ranks, rs)
	}
	j.hello = make([]atomic.Bool, 2)
	j.conns = make([]*ctrlConn, 2)
	j.trackRanks(8)
	j.out = newOutput(io.Discard, io.Discard, false, nil)
	j.served = make(chan error, 1)
	j.served <- served
	return j
}

// TestBlameTerminatedRankThatExitedZero: rank 3 fails first (exit status
// 2, after it closed its client, or before it joined: the server does not
// abort). The launcher then SIGTERMs the others; rank 5 handles SIGTERM
// and exits 0 without closing its client, so the server, which had seen
// nothing wrong yet, reports rank 5 lost. blameCulprit must not put rank 5
// first and take the exit status from it: the launcher ended it.
func TestBlameTerminatedRankThatExitedZero(t *testing.T) {
	j := blameJob(&bootstrap.AbortError{Rank: 5, Lost: true, Reason: "its connection ended before it closed its client"})
	now := time.Now().UnixNano()
	j.message(0, message{T: msgExit, Rank: 3, Code: 2, Time: now})
	j.message(1, message{T: msgExit, Rank: 5, Code: 0, Terminated: true, Time: now + int64(time.Second)})
	j.blameCulprit()
	err := failureReport(j.failures)
	var ee *exitError
	if !errors.As(err, &ee) {
		t.Fatalf("report %v", err)
	}
	if ee.code != 2 || !strings.Contains(err.Error(), "\t* rank 3 (node 0): exit status 2") ||
		strings.Index(err.Error(), "rank 5") >= 0 && strings.Index(err.Error(), "rank 5") < strings.Index(err.Error(), "rank 3") {
		t.Errorf("exit status %d, report:\n%v\nwant rank 3 first and its status 2: rank 5 exited 0 because the launcher terminated it", ee.code, err)
	}
}

// TestBlameRankThatClosedBeforeCollective: the server aborts the job
// naming rank 2, not lost: it closed its client (it called Finalize)
// while the others waited for it in a collective, then exited 0. The
// report must not say it never called Finalize.
func TestBlameRankThatClosedBeforeCollective(t *testing.T) {
	j := blameJob(&bootstrap.AbortError{Rank: 2, Blamed: true, Reason: "it closed before taking part in collective 3 (barrier by rank 0)"})
	now := time.Now().UnixNano()
	j.message(0, message{T: msgExit, Rank: 2, Code: 0, Time: now})
	j.message(0, message{T: msgExit, Rank: 0, Code: 1, Time: now + 1, Err: "comm: the job ended"})
	j.blameCulprit()
	err := failureReport(j.failures)
	if err == nil {
		t.Fatal("no report")
	}
	if strings.Contains(err.Error(), "no Finalize") {
		t.Errorf("report:\n%v\nclaims rank 2 did not call Finalize; the server said: it closed before taking part in collective 3", err)
	}
	if !strings.Contains(err.Error(), "rank 2 (node 0): exit status 0: the rendezvous ended the job because of it: it closed before") {
		t.Errorf("report:\n%v\nwant rank 2 reported as the rank the rendezvous ended the job over", err)
	}
}
