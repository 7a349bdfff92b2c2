package xrcnodes

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/verbs"
)

const pathMTU = verbs.MTU1024

// send is a sender on node A: one XRC send QP toward node B, connected to
// the receive QP some receiver made for it, reaches every receiver's SRQ.
func (r *rank) send(ctx context.Context) error {
	recs, err := r.gather(ctx)
	if err != nil {
		return err
	}
	v, err := r.c.Get(ctx, tgtKey(r.env.LocalRank))
	if err != nil {
		return err
	}
	if len(v) != 4 {
		return fmt.Errorf("receive QP number of %d bytes", len(v))
	}
	av := verbs.AHAttr{IsGlobal: true, Port: 1, GRH: verbs.GlobalRoute{DGID: recs[senders].gid, HopLimit: 64}}
	if err := r.ini.Modify(&verbs.QPAttr{State: verbs.QPSRTR, PathMTU: pathMTU, DestQPN: binary.BigEndian.Uint32(v), AH: av},
		verbs.QPAttrState|verbs.QPAttrAV|verbs.QPAttrPathMTU|verbs.QPAttrDestQPN|verbs.QPAttrRQPSN); err != nil {
		return err
	}
	if err := r.ini.Modify(&verbs.QPAttr{State: verbs.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, SQPSN: r.psn},
		verbs.QPAttrState|verbs.QPAttrTimeout|verbs.QPAttrRetryCnt|verbs.QPAttrRNRRetry|verbs.QPAttrSQPSN|verbs.QPAttrMaxQPRdAtomic); err != nil {
		return err
	}
	if err := r.sendRound(ctx, 1, recs, -1); err != nil {
		return err
	}
	if _, err := r.c.AllGather(ctx, nil); err != nil { // the receivers' reports
		return err
	}
	leaver, err := r.plan(ctx)
	if err != nil {
		return err
	}
	if _, err := r.c.Get(ctx, round2Key); err != nil {
		return err
	}
	if err := r.sendRound(ctx, 2, recs, leaver); err != nil {
		return err
	}
	// The receivers keep their receive QPs until every sender is done.
	return r.c.Put(ctx, sentKey(r.env.LocalRank), []byte{1})
}

// sendRound sends a message to the SRQ of every receiver but skip, through
// the one send QP, and waits for their completions.
func (r *rank) sendRound(ctx context.Context, round int, recs []record, skip int) error {
	n := 0
	for j := range receivers {
		if senders+j == skip {
			continue
		}
		copy(r.buf[j*msgSize:], payload(round, r.env.LocalRank, j))
		if err := r.ini.PostSend(&verbs.SendWR{WRID: uint64(j), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SG: []verbs.SGE{r.mr.SGE(j*msgSize, msgSize)}, RemoteSRQNum: recs[senders+j].srqn}); err != nil {
			return fmt.Errorf("round %d: send to receiver %d: %w", round, j, err)
		}
		n++
	}
	for range n {
		wc, err := r.poll(ctx)
		if err != nil {
			return err
		}
		if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCSend {
			return fmt.Errorf("round %d: send to receiver %d: %v, opcode %v", round, wc.WRID, wc.Status, wc.Opcode)
		}
	}
	return nil
}

// receive is a receiver on node B. For each sender it claims the receive
// QP through bootstrap's write-once store: the first receiver to claim it
// creates it and publishes its number, the others open it by number.
func (r *rank) receive(ctx context.Context) error {
	recs, err := r.gather(ctx)
	if err != nil {
		return err
	}
	me := r.env.LocalRank
	r.tgts = make([]*verbs.QP, senders)
	qpns := make([]uint32, senders)
	created := 0
	for k := range senders {
		i := (me + k) % senders // receivers start with different senders, so claims race
		err := r.c.Put(ctx, claimKey(i), []byte{byte(me)})
		switch {
		case err == nil:
			if r.tgts[i], err = r.createTgt(recs[i]); err != nil {
				return err
			}
			if err := r.c.Put(ctx, tgtKey(i), binary.BigEndian.AppendUint32(nil, r.tgts[i].Num())); err != nil {
				return err
			}
			created++
		case errors.Is(err, bootstrap.ErrKeyExists):
			v, err := r.c.Get(ctx, tgtKey(i))
			if err != nil {
				return err
			}
			if len(v) != 4 {
				return fmt.Errorf("receive QP number of %d bytes", len(v))
			}
			if r.tgts[i], err = r.xrcd.OpenQP(binary.BigEndian.Uint32(v)); err != nil {
				return err
			}
		default:
			return err
		}
		qpns[i] = r.tgts[i].Num()
	}
	if err := r.receiveRound(ctx, 1, qpns); err != nil {
		return err
	}
	if _, err := r.c.AllGather(ctx, report(created, qpns)); err != nil {
		return err
	}
	leaver, err := r.plan(ctx)
	if err != nil || r.env.Rank == leaver {
		return err // the leaver closes everything it made or opened and exits
	}
	if err := r.receiveRound(ctx, 2, qpns); err != nil {
		return err
	}
	for i := range senders {
		if _, err := r.c.Get(ctx, sentKey(i)); err != nil {
			return err
		}
	}
	return nil
}

// createTgt creates the receive QP for sender a and brings it to RTR.
func (r *rank) createTgt(a record) (*verbs.QP, error) {
	qp, err := r.xrcd.CreateTgtQP()
	if err != nil {
		return nil, err
	}
	av := verbs.AHAttr{IsGlobal: true, Port: 1, GRH: verbs.GlobalRoute{DGID: a.gid, HopLimit: 64}}
	err = qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1},
		verbs.QPAttrState|verbs.QPAttrPkeyIndex|verbs.QPAttrPort|verbs.QPAttrAccessFlags)
	if err == nil {
		err = qp.Modify(&verbs.QPAttr{State: verbs.QPSRTR, PathMTU: pathMTU, DestQPN: a.qpn, RQPSN: a.psn,
			MinRNRTimer: 12, AH: av}, verbs.QPAttrState|verbs.QPAttrAV|verbs.QPAttrPathMTU|verbs.QPAttrDestQPN|
			verbs.QPAttrRQPSN|verbs.QPAttrMaxDestRdAtomic|verbs.QPAttrMinRNRTimer)
	}
	if err != nil {
		return nil, errors.Join(err, qp.Close())
	}
	return qp, nil
}

// receiveRound takes one message from every sender and checks that it
// was meant for this SRQ and arrived on that sender's receive QP.
func (r *rank) receiveRound(ctx context.Context, round int, qpns []uint32) error {
	seen := make([]bool, senders)
	for range senders {
		wc, err := r.poll(ctx)
		if err != nil {
			return err
		}
		if wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCRecv || wc.ByteLen != msgSize || wc.WRID >= slots {
			return fmt.Errorf("round %d: receive completion %+v", round, wc)
		}
		m := r.buf[wc.WRID*msgSize:][:msgSize]
		from := int(binary.BigEndian.Uint32(m[8:]))
		if from >= senders || string(m) != string(payload(round, from, r.env.LocalRank)) || seen[from] {
			return fmt.Errorf("round %d: message %x on the SRQ of receiver %d", round, m, r.env.LocalRank)
		}
		if wc.QPNum != qpns[from] {
			return fmt.Errorf("round %d: sender %d's message completed on QP %#x, not on its receive QP %#x", round, from, wc.QPNum, qpns[from])
		}
		seen[from] = true
	}
	return nil
}

// plan takes the controller's choice of the receiver that leaves early.
func (r *rank) plan(ctx context.Context) (int, error) {
	recs, err := r.c.AllGather(ctx, nil)
	if err != nil {
		return 0, err
	}
	if len(recs[controller]) != 1 {
		return 0, fmt.Errorf("a plan of %d bytes", len(recs[controller]))
	}
	return int(recs[controller][0]), nil
}

// poll waits for the next completion, sleeping on the completion channel.
func (r *rank) poll(ctx context.Context) (verbs.WorkCompletion, error) {
	wc := make([]verbs.WorkCompletion, 1)
	for armed := false; ; {
		n, err := r.cq.Poll(wc)
		if err != nil || n == 1 {
			return wc[0], err
		}
		if armed {
			if _, err := r.ch.GetEvent(ctx); err != nil {
				return wc[0], err
			}
			armed = false
			continue
		}
		if err := r.cq.RequestNotify(false); err != nil {
			return wc[0], err
		}
		armed = true // poll once more: a completion may have come before the arming
	}
}
