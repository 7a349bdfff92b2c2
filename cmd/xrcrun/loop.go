package main

import (
	"context"
	"syscall"
	"time"
)

// loop runs the job until every rank has ended and every process the
// launcher started has exited. A rank that fails, a signal (ctx) or the
// timeout ends the job early: SIGTERM to the ranks, SIGKILL after the
// grace period.
func (j *job) loop(ctx context.Context) {
	var timeout <-chan time.Time
	if j.cfg.timeout > 0 {
		t := time.NewTimer(j.cfg.timeout)
		defer t.Stop()
		timeout = t.C
	}
	tick := time.NewTicker(150 * time.Millisecond)
	defer tick.Stop()
	ctxDone := ctx.Done()
	for !j.finished() {
		select {
		case ev := <-j.events:
			j.handle(ev)
		case <-ctxDone:
			ctxDone = nil
			j.end(context.Cause(ctx))
		case <-timeout:
			j.end(errTimeout(j.cfg.timeout))
		case <-j.killC:
			// The grace period is over: SIGKILL what is left.
			j.killC = nil
			if j.cause != nil && j.out.full() {
				// The user asked the job to stop, and nobody reads its
				// output: drop it, so that the agents' reports come.
				j.log.Debug("output not read; dropping it")
				j.out.drop()
			}
			j.log.Debug("grace period over; killing the ranks")
			j.rdv.Abort("the job is ending")
			j.broadcast(message{T: msgKill})
			j.hardC = time.After(5 * time.Second)
		case <-j.hardC:
			// Agents that do not answer are killed with their ranks; but
			// not while they cannot, because the launcher does not read
			// them until its output is written.
			if j.out.full() {
				j.hardC = time.After(5 * time.Second)
				continue
			}
			j.hardC = nil
			j.log.Warn("node agents do not answer; killing them")
			j.killProcs()
			for r, d := range j.rankDone {
				if !d {
					j.log.Warn("rank not confirmed ended", "rank", r)
					j.rankEnded(r)
				}
			}
		case <-j.lateC:
			j.lateC = nil
			j.agentsLate()
		case <-j.drainC:
			j.drainC = nil
			j.log.Warn("node agents have not exited; killing them")
			j.killProcs()
		case <-tick.C:
			j.out.updateStatus(j.id, j.ready, len(j.place.Nodes), j.started, j.rdv.Joined(), len(j.place.Node))
		}
	}
}

// finished says the job is over. Once every rank has ended, the agents are
// told to stop, and the launcher waits for its processes to exit.
func (j *job) finished() bool {
	if j.done < len(j.place.Node) {
		return false
	}
	if !j.byeSent {
		j.byeSent = true
		j.out.stopStatus()
		j.broadcast(message{T: msgBye})
		j.killC, j.hardC = nil, nil
		j.drainC = time.After(15 * time.Second)
	}
	for _, p := range j.procs {
		if !p.exited {
			return false
		}
	}
	return true
}

func (j *job) handle(ev event) {
	switch ev.kind {
	case evConnected:
		if j.conns[ev.node] != nil {
			j.log.Warn("a second agent for a node; refused", "node", ev.node)
			ev.conn.close()
			return
		}
		j.conns[ev.node] = ev.conn
		j.agentConnected(ev.node)
		go j.read(ev.node, ev.conn)
		j.log.Debug("agent connected", "node", ev.node)
		if j.byeSent {
			ev.conn.post(message{T: msgBye})
			break
		}
		// The agent reads its commands once it has started its ranks.
		for _, sig := range j.pending[ev.node] {
			ev.conn.post(message{T: msgSignal, Signal: int(sig)})
		}
		delete(j.pending, ev.node)
		if j.ending {
			ev.conn.post(message{T: msgTerm})
		}
	case evMessage:
		j.message(ev.node, ev.msg)
	case evSignal:
		j.forward(ev.sig)
	case evGone:
		j.killOrphans(ev.node)
		j.nodeLost(ev.node, "its node agent went away")
	case evNoSpec:
		j.nodeLost(ev.node, "its node agent did not get its spec: "+ev.err.Error())
	case evExited:
		ev.proc.exited = true
		j.log.Debug("process exited", "what", ev.proc.what, "err", ev.err)
		// An agent that connected and exited at once (it failed) may be
		// seen exiting before its connection is: wait for it a moment.
		ev.kind = evUnseen
		time.AfterFunc(2*time.Second, func() { j.post(ev) })
	case evUnseen:
		for _, k := range ev.proc.nodes {
			if !j.hello[k].Load() && !j.byeSent {
				detail := "its node agent exited before it connected"
				if ev.err != nil {
					detail += " (" + ev.proc.what + ": " + ev.err.Error() + ")"
				}
				detail += ev.proc.out.said()
				j.nodeLost(k, detail)
			}
		}
	}
}

func (j *job) message(node int, m message) {
	switch m.T {
	case msgReady:
		j.ready++
		j.log.Debug("node ready", "node", node, "host", m.Host, "device", m.Device, "addr", m.Addr)
	case msgStarted:
		j.started++
		if j.validRank(node, m.Rank) && !j.rankDone[m.Rank] {
			j.rankPID[m.Rank] = m.PID
		}
	case msgOut:
		if j.validRank(node, m.Rank) {
			j.out.write(m.Rank, m.Stream, m.Data)
		}
	case msgExit:
		if !j.validRank(node, m.Rank) || j.rankDone[m.Rank] {
			return
		}
		if m.Code == 0 && m.Signal == 0 && !m.Terminated { // not after the launcher's SIGTERM
			j.quitAt[m.Rank] = max(m.Time, 1)
		}
		if (m.Code != 0 || m.Signal != 0) && !m.Terminated {
			j.failures = append(j.failures, rankFailure{Rank: m.Rank, Node: node, Host: j.hostOf(node),
				Code: m.Code, Signal: m.Signal, Detail: m.Err, Time: m.Time})
			j.end(nil)
		}
		j.rankEnded(m.Rank)
	case msgFail:
		j.nodeLost(node, "its node agent failed: "+m.Err)
	}
}

// validRank says rank runs on node.
func (j *job) validRank(node, rank int) bool {
	return rank >= 0 && rank < len(j.place.Node) && j.place.Node[rank] == node
}

func (j *job) rankEnded(r int) {
	if !j.rankDone[r] {
		j.out.flush(r) // a last line without its newline
		j.rankDone[r] = true
		j.done++
	}
}

// killOrphans kills, on this machine, the process groups of the ranks of
// node whose agent went away before they ended (it was killed outright:
// SIGKILL, the OOM killer): a rank dies with its agent (its parent-death
// signal), but what it started lives on in its group. A group outlives its
// leader, and while it does the kernel gives its number to no other
// process. Remote nodes' agents cannot be reached once gone: there, and
// here too, the agent's guard kills those groups (guard.go); this covers a
// guard killed with its agent.
func (j *job) killOrphans(node int) {
	if j.mode != modeLocal {
		return
	}
	for _, r := range j.place.Ranks[node] {
		if pid := j.rankPID[r]; pid > 0 && !j.rankDone[r] {
			syscall.Kill(-pid, syscall.SIGKILL)
		}
	}
}

// nodeLost fails the ranks of node that have not ended. Every node lost
// is a failure, the first and those after it, while the job ends because
// of one; not once a signal or the timeout ends the job (j.cause): its
// ranks are being ended anyway.
func (j *job) nodeLost(node int, why string) {
	lost := false
	for _, r := range j.place.Ranks[node] {
		if j.rankDone[r] {
			continue
		}
		lost = true
		if j.cause == nil {
			j.failures = append(j.failures, rankFailure{Rank: r, Node: node, Host: j.hostOf(node), Lost: true,
				Detail: why, Time: time.Now().UnixNano()})
		}
		j.rankEnded(r)
	}
	if lost {
		j.end(nil)
	}
}

// end starts ending the job early, once: the ranks get SIGTERM now and
// SIGKILL after the grace period. cause is a signal or the timeout; nil
// for a failed rank.
func (j *job) end(cause error) {
	if j.ending {
		return
	}
	j.ending, j.cause = true, cause
	j.out.stopStatus()
	j.log.Debug("ending the job", "cause", cause)
	j.broadcast(message{T: msgTerm})
	j.killC = time.After(j.cfg.grace + 2*time.Second)
}

// broadcast sends m to every connected agent, without waiting (post).
func (j *job) broadcast(m message) {
	for _, c := range j.conns {
		if c != nil {
			c.post(m)
		}
	}
}

// forward sends sig to the ranks of every connected agent, and holds it
// for the nodes whose agents have not connected yet (at most maxPending
// signals a node), to send when they do: a signal sent to the launcher
// while the job starts reaches every rank.
func (j *job) forward(sig syscall.Signal) {
	j.log.Debug("forwarding a signal", "signal", sig)
	for k, c := range j.conns {
		switch {
		case c != nil:
			c.post(message{T: msgSignal, Signal: int(sig)})
		case len(j.pending[k]) < maxPending:
			if j.pending == nil {
				j.pending = map[int][]syscall.Signal{}
			}
			j.pending[k] = append(j.pending[k], sig)
		}
	}
}

const maxPending = 16

// killProcs SIGKILLs the process groups of the processes the launcher
// started; an agent's ranks die with it (their parent-death signal).
func (j *job) killProcs() {
	for _, p := range j.procs {
		if !p.exited && p.pid > 0 {
			syscall.Kill(-p.pid, syscall.SIGKILL)
		}
	}
}
