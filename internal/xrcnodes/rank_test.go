package xrcnodes

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/xrcrun/xrc/bootstrap"
	_ "github.com/xrcrun/xrc/mlx4"
	_ "github.com/xrcrun/xrc/softhca" // the soft driver: devices in device processes
	"github.com/xrcrun/xrc/verbs"
)

// rank is one worker process: a sender on node A or a receiver on node B.
type rank struct {
	c    *bootstrap.Client
	env  bootstrap.Env
	dev  *verbs.Context
	pd   *verbs.PD
	ch   *verbs.CompChannel
	cq   *verbs.CQ
	buf  []byte
	mr   *verbs.MR
	file *os.File
	xrcd *verbs.XRCD
	srq  *verbs.SRQ  // on B
	ini  *verbs.QP   // on A: the one send QP toward node B
	tgts []*verbs.QP // on B: this process's handles of the receive QPs, by sender
	gid  verbs.GID
	psn  uint32
}

// record is what a worker tells every rank in the first all-gather.
type record struct {
	qpn, psn, srqn uint32
	gid            verbs.GID
}

func (r record) bytes() []byte {
	b := binary.BigEndian.AppendUint32(nil, r.qpn)
	b = binary.BigEndian.AppendUint32(b, r.psn)
	b = binary.BigEndian.AppendUint32(b, r.srqn)
	return append(b, r.gid[:]...)
}

func parseRecord(b []byte) (record, error) {
	if len(b) != 28 {
		return record{}, fmt.Errorf("a record of %d bytes", len(b))
	}
	r := record{qpn: binary.BigEndian.Uint32(b), psn: binary.BigEndian.Uint32(b[4:]), srqn: binary.BigEndian.Uint32(b[8:])}
	copy(r.gid[:], b[12:])
	return r, nil
}

// The payload of a message: magic, round, sender (A's local rank) and
// receiver (B's local rank).
const (
	magic   = 0x58524321
	msgSize = 16
	slots   = 2 * senders // receives a B process posts: one per sender and round
)

func payload(round, from, to int) []byte {
	b := binary.BigEndian.AppendUint32(nil, magic)
	for _, v := range []int{round, from, to} {
		b = binary.BigEndian.AppendUint32(b, uint32(v))
	}
	return b
}

// rankMain runs the worker the launcher's environment describes and
// returns its exit status.
func rankMain() int {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, env, err := bootstrap.FromEnv(ctx, bootstrap.ClientConfig{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	r := &rank{c: c, env: env}
	if err = r.setup(ctx); err == nil {
		if env.Node == nodeA {
			err = r.send(ctx)
		} else {
			err = r.receive(ctx)
		}
	}
	err = errors.Join(err, r.close())
	if err != nil {
		err = fmt.Errorf("rank %d (node %d): %w", env.Rank, env.Node, err)
		fmt.Fprintln(os.Stderr, err)
		c.Abort(ctx, err.Error())
		return 1
	}
	if err := c.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// setup opens the node's device and domain and, on B, the XRC SRQ with a
// receive for every message to come.
func (r *rank) setup(ctx context.Context) error {
	var err error
	if r.dev, err = verbs.Open(ctx, r.env.Device, verbs.Config{}); err != nil {
		return err
	}
	port, err := r.dev.QueryPort(1)
	if err != nil {
		return err
	}
	r.gid = port.GID
	if r.pd, err = r.dev.AllocPD(); err != nil {
		return err
	}
	if r.ch, err = r.dev.CreateCompChannel(); err != nil {
		return err
	}
	if r.cq, err = r.dev.CreateCQ(2*slots, r.ch, 0); err != nil {
		return err
	}
	if r.buf, err = verbs.Alloc(slots * msgSize); err != nil {
		return err
	}
	if r.mr, err = r.pd.RegMR(r.buf, verbs.AccessLocalWrite); err != nil {
		return err
	}
	// Every process of a node opens the node's file: one domain per node.
	if r.file, err = os.Open(os.Getenv(envDomain)); err != nil {
		return err
	}
	if r.xrcd, err = r.dev.OpenXRCD(r.file, os.O_CREATE); err != nil {
		return err
	}
	if r.env.Node == nodeB {
		if r.srq, err = r.pd.CreateXRCSRQ(r.xrcd, r.cq, verbs.SRQAttr{MaxWR: slots, MaxSGE: 1}); err != nil {
			return err
		}
		for k := range slots {
			if err := r.srq.PostRecv(&verbs.RecvWR{WRID: uint64(k), SG: []verbs.SGE{r.mr.SGE(k*msgSize, msgSize)}}); err != nil {
				return err
			}
		}
		return nil
	}
	r.ini, err = r.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTXRCIni, SendCQ: r.cq,
		Cap: verbs.QPCap{MaxSendWR: 2 * receivers, MaxSendSGE: 1}})
	if err != nil {
		return err
	}
	r.psn = uint32(r.env.Rank+1) * 0x1000
	return r.ini.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1},
		verbs.QPAttrState|verbs.QPAttrPkeyIndex|verbs.QPAttrPort|verbs.QPAttrAccessFlags)
}

// gather exchanges the first records: a sender's send QP, a receiver's
// SRQ.
func (r *rank) gather(ctx context.Context) ([]record, error) {
	my := record{psn: r.psn, gid: r.gid}
	if r.ini != nil {
		my.qpn = r.ini.Num()
	}
	if r.srq != nil {
		my.srqn = r.srq.Num()
	}
	raw, err := r.c.AllGather(ctx, my.bytes())
	if err != nil {
		return nil, err
	}
	recs := make([]record, senders+receivers)
	for i := range recs {
		if recs[i], err = parseRecord(raw[i]); err != nil {
			return nil, fmt.Errorf("rank %d: %w", i, err)
		}
	}
	return recs, nil
}

func tgtKey(sender int) string   { return "tgt/" + strconv.Itoa(sender) }
func claimKey(sender int) string { return "tgt-claim/" + strconv.Itoa(sender) }
func sentKey(sender int) string  { return "sent/" + strconv.Itoa(sender) }

// report is a worker's part of the second all-gather: a receiver's count
// of receive QPs it created and the numbers of all four, by sender.
func report(created int, qpns []uint32) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(created))
	for _, q := range qpns {
		b = binary.BigEndian.AppendUint32(b, q)
	}
	return b
}

// close frees the worker's objects: everything this process holds, which
// for a receive QP is its opener's reference.
func (r *rank) close() error {
	var errs []error
	closeObj := func(c interface{ Close() error }) {
		if err := c.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, q := range r.tgts {
		if q != nil {
			closeObj(q)
		}
	}
	if r.ini != nil {
		closeObj(r.ini)
	}
	if r.srq != nil {
		closeObj(r.srq)
	}
	if r.xrcd != nil {
		closeObj(r.xrcd)
	}
	if r.mr != nil {
		closeObj(r.mr)
	}
	if r.cq != nil {
		closeObj(r.cq)
	}
	if r.pd != nil {
		closeObj(r.pd)
	}
	if r.ch != nil {
		closeObj(r.ch)
	}
	if r.file != nil {
		closeObj(r.file)
	}
	if r.dev != nil {
		closeObj(r.dev)
	}
	if r.buf != nil {
		verbs.Free(r.buf)
	}
	return errors.Join(errs...)
}
