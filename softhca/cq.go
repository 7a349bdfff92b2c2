//go:build linux

package softhca

import (
	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/qpstate"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
)

// Async event types (enum ib_event_type).
const (
	evCQErr            = 0
	evQPFatal          = 1
	evQPReqErr         = 2
	evQPAccessErr      = 3
	evCommEst          = 4
	evSQDrained        = 5
	evDeviceFatal      = 8
	evPortActive       = 9
	evPortErr          = 10
	evSRQErr           = 14
	evSRQLimitReached  = 15
	evQPLastWQEReached = 16
)

// cq is a completion queue: the device writes CQEs into the client's ring
// at the producer index; the client's consumer index comes back through the
// doorbell record.
type cq struct {
	num        uint32
	client     *Client
	userHandle uint64
	buf        []byte // the ring: n entries of cqeSize bytes
	n          uint32
	db         []byte // set_ci word, arm word
	ch         *compChannel
	usecnt     int    // QPs using it
	pi         uint32 // producer index
	armed      uint32 // mlx4hw.CQDBReqNot, CQDBReqNotSol or 0
	errored    bool   // overrun: no more CQEs
	events     uint32 // completion events delivered
}

func (d *Device) cmdCreateCQ(r *request) ([]byte, error) {
	req, drvb, err := payload[uverbs.CreateCQ](r)
	if err != nil {
		return nil, err
	}
	drv, err := driverData[mlx4abi.IBCreateCQ](r, drvb)
	if err != nil {
		return nil, err
	}
	if req.CQE < 1 || req.CQE > maxCQE {
		return nil, unix.Errorf(unix.EINVAL, "cq of %d entries (1..%d)", req.CQE, maxCQE)
	}
	if req.CompVector >= numCompVectors {
		return nil, unix.Errorf(unix.EINVAL, "completion vector %d of %d", req.CompVector, numCompVectors)
	}
	if len(d.cqs) >= maxCQ {
		return nil, unix.Error(unix.ENOMEM, "too many CQs")
	}
	var ch *compChannel
	if req.CompChannel >= 0 {
		if ch = r.c.channels[req.CompChannel]; ch == nil {
			return nil, unix.Errorf(unix.EINVAL, "no completion channel %d", req.CompChannel)
		}
	}
	n := roundPow2(req.CQE + 1)
	buf, err := r.c.mem.queue(drv.BufAddr, int(n)*cqeSize)
	if err != nil {
		return nil, err
	}
	db, err := r.c.mem.queue(drv.DBAddr, mlx4hw.CQDBRecSize)
	if err != nil {
		return nil, err
	}
	if drv.DBAddr%4 != 0 || drv.BufAddr%8 != 0 {
		return nil, unix.Error(unix.EINVAL, "misaligned CQ buffer or doorbell record")
	}
	core := uverbs.CreateCQResp{CQE: n - 1}
	if r.outLen < int(unsafeSize(core)) {
		return nil, unix.Error(unix.ENOSPC, "no room for the response")
	}
	q := &cq{num: d.nextCQN, client: r.c, userHandle: req.UserHandle, buf: buf, n: n, db: db, ch: ch}
	d.nextCQN++
	// The device owns every entry for the first pass, as firmware sets up
	// a new CQ.
	for i := uint32(0); i < n; i++ {
		buf[int(i)*cqeSize+cqeSize-1] = mlx4hw.CQEOwnerMask
	}
	if ch != nil {
		ch.refs++
	}
	d.cqs[q.num] = q
	core.CQHandle = r.c.addObject(q)
	drvResp := mlx4abi.IBCreateCQResp{CQN: q.num}
	return response(r, &core, &drvResp)
}

func (d *Device) cmdDestroyCQ(r *request) ([]byte, error) {
	req, _, err := payload[uverbs.DestroyCQ](r)
	if err != nil {
		return nil, err
	}
	q, err := object[*cq](r.c, req.CQHandle)
	if err != nil {
		return nil, err
	}
	resp := uverbs.DestroyCQResp{CompEventsReported: q.events}
	if r.outLen < int(unsafeSize(resp)) { // fail before destroying anything
		return nil, unix.Error(unix.ENOSPC, "no room for the response")
	}
	if err := d.destroyCQ(q); err != nil {
		return nil, err
	}
	delete(r.c.objs, req.CQHandle)
	return response[uverbs.DestroyCQResp, noDriver](r, &resp, nil)
}

func (d *Device) destroyCQ(q *cq) error {
	if q.usecnt > 0 {
		return unix.Errorf(unix.EBUSY, "cq %d is used by %d queues", q.num, q.usecnt)
	}
	delete(d.cqs, q.num)
	if q.ch != nil {
		q.ch.release()
		q.ch = nil
	}
	return nil
}

// push writes a CQE at the producer index and delivers a completion event
// if the CQ is armed for it. solicited says whether the completion is a
// solicited receive; errors always qualify. Caller holds d.mu.
func (d *Device) push(q *cq, e *mlx4hw.CQE, solicited bool) {
	if q.errored {
		return
	}
	ci := mlx4hw.LoadBE32(q.db[0:]) & 0xffffff
	if (q.pi-ci)&0xffffff >= q.n {
		// Overrun: the CQ is in error and reports it once; the QPs that
		// use it fail at the end of the engine's round.
		q.errored = true
		d.counters.CQOverruns.Add(1)
		q.client.asyncEvent(q.userHandle, evCQErr)
		d.eng.overrun = append(d.eng.overrun, q)
		d.eng.kick()
		return
	}
	e.Owner = q.pi&q.n != 0
	off := int(q.pi&(q.n-1)) * cqeSize
	e.Put(q.buf[off : off+cqeSize])
	q.pi++
	if q.armed == mlx4hw.CQDBReqNot || (q.armed == mlx4hw.CQDBReqNotSol && (solicited || e.IsError())) {
		d.notify(q)
	}
}

// failCQUsers moves every QP that completes into q to the error state with
// a QP fatal event: its completions have nowhere to go. An XRC receive QP
// has no CQ of its own: it completes into the CQ of its message's SRQ, and
// fails when a completion of its finds that CQ overrun (completeRecv,
// recvError) or a message of its names an SRQ whose CQ is (bindXRCSRQ), as
// hardware fails the QPs that write into an overrun CQ. Caller holds d.mu.
func (d *Device) failCQUsers(q *cq) {
	for p := range d.qps.all {
		if p.scq == q || p.rcq == q {
			d.failCQUser(p)
		}
	}
}

// failCQUser moves q, whose completions have nowhere to go, to the error
// state with a QP fatal event. Caller holds d.mu.
func (d *Device) failCQUser(q *qp) {
	if q.state != qpstate.Err && q.state != qpstate.Reset && !q.destroyed {
		d.setState(q, qpstate.Err)
		d.qpEvent(q, evQPFatal)
	}
}

// notify delivers a completion event and disarms the CQ.
func (d *Device) notify(q *cq) {
	q.armed = 0
	if q.ch == nil {
		return
	}
	if err := q.ch.send(q.userHandle); err != nil {
		d.counters.EventsDropped.Add(1)
		return
	}
	q.events++
}

// arm handles a CQ doorbell: the upper word holds the sequence number, the
// command and the CQ number; the lower the consumer index at arm time. If
// CQEs beyond that index are already there, the event fires at once.
// Caller holds d.mu.
func (d *Device) arm(c *Client, v uint64) {
	hi, ci := uint32(v>>32), uint32(v)&0xffffff
	q := d.cqs[hi&0xffffff]
	if q == nil || q.client != c {
		d.counters.BadDoorbells.Add(1)
		return
	}
	cmd := hi & mlx4hw.CQDBCmdMask
	if cmd != mlx4hw.CQDBReqNot && cmd != mlx4hw.CQDBReqNotSol {
		d.counters.BadDoorbells.Add(1)
		return
	}
	q.armed = cmd
	if (q.pi-ci)&0xffffff != 0 && !q.errored {
		d.notify(q)
	}
}
