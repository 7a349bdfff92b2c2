//go:build linux

package softhca

import (
	"container/heap"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/xrcrun/xrc/internal/mlx4hw"
	"github.com/xrcrun/xrc/internal/qpstate"
	"github.com/xrcrun/xrc/internal/racedma"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/softhca/roce"
)

// engine is the device's data path: one goroutine that rings the doorbells
// clients write, runs requesters and responders, and fires timers.
// Producers (clients' doorbells, other devices' packets) queue work and kick
// it; a kick costs a channel send only while the engine sleeps, so a busy
// engine is never woken twice.
type engine struct {
	d         *Device
	spin      time.Duration
	spinYield bool // yield the thread, not only the goroutine, while spinning

	qmu sync.Mutex
	rx  []*roce.Packet // guarded by qmu: packets delivered to the device
	// rxSince is when the oldest packet in rx was delivered (wall clock
	// nanoseconds). Guarded by qmu.
	rxSince int64
	bells   []doorbell    // guarded by qmu
	rings   []*bellSource // guarded by qmu: the bell rings of other processes' clients

	pending  atomic.Bool // work was queued since the engine last looked
	sleeping atomic.Bool
	wake     chan struct{}
	quit     chan struct{}
	done     chan struct{}

	// Owned by the engine goroutine; touched with d.mu held.
	rxWork   []*roce.Packet
	bellWork []doorbell
	out      []*roce.Packet // packets to send once d.mu is released
	runq     []*qp          // QPs whose send queue wants attention
	runNext  []*qp          // the other half of runq's double buffer
	acks     []*qp          // QPs owing an acknowledgement
	overrun  []*cq          // CQs that overran this round
	cqLost   []*qp          // XRC receive QPs whose completion found its CQ overrun
	readq    []*qp          // QPs with READ responses to send
	readNext []*qp          // the other half of readq's double buffer
	errq     []*qp          // QPs in the error state with a receive queue to flush
	faults   *faulter
	pkts     pktCache // used by the engine goroutine only
	wqes     wqePool  // guarded by d.mu
	// sgScratch holds the SGEs of a receive WQE while the responder
	// checks them (takeRecv); guarded by d.mu.
	sgScratch []mlx4hw.DataSeg
	timers    timerHeap
	timer     Timer
	timerAt   time.Time
	// now is the device clock, read once at the start of each round: every
	// time the data path needs (timer deadlines, round-trip samples, RNR
	// waits) is taken from it, so a round reads the clock once however
	// many messages it moves. nowI is the same as an instant.
	now   time.Time
	nowI  instant
	epoch time.Time // instant 0: the clock when the engine was made
	// rxStamp is when the host took in the oldest datagram the round read
	// (the kernel's receive time, in wall clock nanoseconds), or was handed
	// the oldest packet it took from rx (rxSince), or 0: set as the round
	// gathers its work (the link's poll), checked when the round's answers
	// have left (noteLateRound).
	rxStamp int64
	// Scratch space of warm.
	warmAddrs []uintptr
	warmQPs   []warmQP
	// Scratch space of the packets of a run a round reads from memory at
	// once (sendReads, sendRequests), and of their payloads.
	runPkts    []*roce.Packet
	runBufs    [][]byte
	gatherBufs [][]byte // gatherRun's pieces of runBufs for one region
	// run is the READ response payloads waiting to be written at once.
	run writeRun
	// holdReads, a test hook, stops the rounds from sending READ
	// responses (the QPs stay in readq) until it is cleared and the
	// engine kicked: what waits behind them waits as long as a test
	// needs, however slow the machine.
	holdReads bool // guarded by d.mu
}

// instant is a time on the device clock: nanoseconds since the engine's
// epoch (the clock's reading when the engine was made), in 8 bytes where a
// time.Time takes 24. The zero instant means none: the data path only
// stores instants of the clock's readings after the epoch, or later
// deadlines.
type instant int64

func (t instant) add(d time.Duration) instant { return t + instant(d) }
func (t instant) sub(u instant) time.Duration { return time.Duration(t - u) }

// instant converts a time on the device clock.
func (e *engine) instant(t time.Time) instant { return instant(t.Sub(e.epoch)) }

// time converts an instant back.
func (e *engine) time(t instant) time.Time { return e.epoch.Add(time.Duration(t)) }

// doorbell is a UAR write of a client.
type doorbell struct {
	c   *Client
	off int
	v   uint64
}

// bellSource is the bell ring of a client in another process.
type bellSource struct {
	c    *Client
	r    *bellRing
	head uint32 // guarded by qmu
}

func newEngine(d *Device, spin time.Duration, spinYield bool, f Faults) *engine {
	e := &engine{d: d, spin: spin, spinYield: spinYield, wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
		faults: newFaulter(f)}
	if d.clock != nil {
		e.epoch = d.clock.Now()
	} else { // a device made by hand in a test, whose engine never runs
		e.epoch = time.Now()
	}
	return e
}

func (e *engine) stop() {
	close(e.quit)
	<-e.done
}

// kick tells the engine there is work.
func (e *engine) kick() {
	e.pending.Store(true)
	if e.sleeping.Load() {
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
}

// deliver queues a packet for the device; the device owns it from now on.
// A payload borrowed from a region is copied into the packet first: the
// device may not get to it before the region is gone.
func (e *engine) deliver(p *roce.Packet) {
	own(p)
	e.qmu.Lock()
	if len(e.rx) == 0 {
		e.rxSince = time.Now().UnixNano()
	}
	e.rx = append(e.rx, p)
	e.qmu.Unlock()
	e.kick()
}

// ring queues a UAR write.
func (e *engine) ring(c *Client, off int, v uint64) {
	e.qmu.Lock()
	e.bells = append(e.bells, doorbell{c: c, off: off, v: v})
	e.qmu.Unlock()
	e.kick()
}

// addRing starts taking doorbells from a client's bell ring.
func (e *engine) addRing(s *bellSource) {
	e.qmu.Lock()
	e.rings = append(e.rings, s)
	e.qmu.Unlock()
	e.kick()
}

// removeRing stops taking doorbells from a ring; once it returns, the
// engine no longer touches the ring's memory.
func (e *engine) removeRing(s *bellSource) {
	e.qmu.Lock()
	e.rings = slices.DeleteFunc(e.rings, func(x *bellSource) bool { return x == s })
	e.qmu.Unlock()
}

// setRingsSleeping tells the clients of bell rings whether the engine
// sleeps, and reports whether a ring has doorbells waiting (then the engine
// must not sleep after all).
func (e *engine) setRingsSleeping(sleeping bool) bool {
	e.qmu.Lock()
	defer e.qmu.Unlock()
	v := uint32(0)
	if sleeping {
		v = 1
	}
	waiting := false
	for _, s := range e.rings {
		s.r.sleeping.Store(v)
	}
	for _, s := range e.rings {
		waiting = waiting || s.r.pending(s.head)
	}
	return waiting
}

// schedule asks for a QP's send queue to be looked at in this round.
// Caller holds d.mu (it is called from commands and from the engine).
func (e *engine) schedule(q *qp) {
	if !q.req.scheduled {
		q.req.scheduled = true
		e.runq = append(e.runq, q)
	}
	e.kick()
}

// endPacketRun sends the packets of a run built in e.runPkts and read into
// through e.runBufs, in order, if send; else returns them to the cache. It
// gives the scratch space back.
func (e *engine) endPacketRun(ps []*roce.Packet, bufs [][]byte, send bool) {
	for _, p := range ps {
		if send {
			e.send(p)
		} else {
			e.pkts.put(p)
		}
	}
	clear(ps)
	clear(bufs)
	e.runPkts, e.runBufs = ps[:0], bufs[:0]
}

// pollBudget is how many datagrams the engine reads from its socket in a
// round, so that a flood cannot starve the rest of its work.
const pollBudget = 64

func (e *engine) loop() {
	defer close(e.done)
	defer e.pkts.spill(len(e.pkts.free))
	// idleSince is when the engine found nothing to do after its last
	// work; zero while it works, so that a busy engine reads no clock for
	// it. It stays set while the engine sleeps: a wake that finds nothing
	// (a periodic timer) is no sign that more is coming, and does not
	// start another spin.
	var idleSince time.Time
	var prevWorked bool // the last round found work, and began at prevStart
	var prevStart time.Time
	for {
		e.pending.Store(false)
		e.qmu.Lock()
		if len(e.rx) > 0 {
			e.rxStamp = e.rxSince // a fabric's, or the device's own, packets
		}
		e.rxWork, e.rx = e.rx, e.rxWork[:0]
		e.bellWork, e.bells = e.bells, e.bellWork[:0]
		for _, s := range e.rings {
			e.bellWork = s.r.take(s.c, &s.head, e.bellWork, &e.d.counters.BadDoorbells)
		}
		e.qmu.Unlock()
		e.rxWork = e.d.link.poll(e.rxWork, pollBudget)

		// The round's packets leave before the device mutex is let go:
		// their payloads may be borrowed from regions (borrowRun), which
		// no command can take away while it is held.
		e.d.mu.Lock()
		worked := e.round()
		e.flushOut()
		e.d.mu.Unlock()
		if e.rxStamp != 0 {
			e.noteLateRound()
		}

		// A round that found work is accounted for when the next one
		// starts (one always follows it), with the clock reading each
		// round takes anyway: its work, its packets' sending and the
		// next round's gathering of work.
		if prevWorked {
			e.d.counters.EngineBusyNs.Add(uint64(max(e.now.Sub(prevStart), 0)))
		}
		prevWorked, prevStart = worked, e.now
		if worked {
			idleSince = time.Time{}
			continue
		}
		if e.pending.Load() {
			continue
		}
		if e.spin > 0 {
			if idleSince.IsZero() {
				idleSince = time.Now()
			}
			if time.Since(idleSince) < e.spin {
				runtime.Gosched()
				if e.spinYield {
					unix.SchedYield()
				}
				continue
			}
		}
		e.sleeping.Store(true)
		e.d.link.idle()
		if e.setRingsSleeping(true) || e.pending.Load() {
			e.sleeping.Store(false)
			e.setRingsSleeping(false)
			continue
		}
		select {
		case <-e.wake:
		case <-e.quit:
			return
		}
		e.sleeping.Store(false)
		e.setRingsSleeping(false)
	}
}

// lateRound is how long after its oldest datagram came a round may end
// before the device counts it late (Counters.LateRounds).
const lateRound = 10 * time.Millisecond

// noteLateRound counts the round that just ended as late if it ended
// lateRound or more after the host took in the oldest datagram it read:
// the device's answers to that datagram (acknowledgements, responses) left
// at least that late, its process unscheduled or its round that long.
func (e *engine) noteLateRound() {
	late := time.Duration(time.Now().UnixNano() - e.rxStamp)
	e.rxStamp = 0
	if late >= lateRound {
		// Its lateness first: a reader takes late_rounds before
		// late_round_ns (Counters.Each), and sees a late round's time
		// with it.
		e.d.counters.LateRoundNs.Add(uint64(late))
		e.d.counters.LateRounds.Add(1)
	}
}

// round processes what was queued: doorbells, packets, due timers, and then
// the send queues that became runnable. It reports whether there was
// anything to do. Caller holds d.mu.
func (e *engine) round() bool {
	d := e.d
	e.now = d.clock.Now()
	e.nowI = e.instant(e.now)
	now := e.now
	worked := len(e.bellWork) > 0 || len(e.rxWork) > 0
	e.warm()
	for i := range e.bellWork {
		b := &e.bellWork[i]
		switch b.off {
		case mlx4hw.UARSendDoorbell:
			q := d.qps.get(uint32(b.v) >> 8)
			if q == nil || q.client != b.c {
				d.counters.BadDoorbells.Add(1)
				break
			}
			e.schedule(q)
		case mlx4hw.UARCQDoorbell:
			d.arm(b.c, b.v)
		default:
			d.counters.BadDoorbells.Add(1)
		}
		b.c = nil
	}
	for i, p := range e.rxWork {
		d.receive(p)
		e.rxWork[i] = nil
	}
	d.endRun() // before the link reads into the buffers the run points into
	if e.fireTimers(e.nowI) {
		worked = true
	}
	for len(e.runq) > 0 {
		worked = true
		runq := e.runq
		e.runq = e.runNext[:0]
		for i, q := range runq {
			q.req.scheduled = false
			if !q.destroyed {
				d.pump(q)
			}
			runq[i] = nil
		}
		e.runNext = runq[:0]
	}
	if len(e.readq) > 0 && !e.holdReads {
		worked = true
		readq := e.readq
		e.readq = e.readNext[:0]
		for i, q := range readq {
			if !q.destroyed && d.sendReads(q) {
				e.readq = append(e.readq, q) // more next round
			} else {
				q.resp.queued = false
			}
			readq[i] = nil
		}
		e.readNext = readq[:0]
	}
	for _, q := range e.errq {
		d.flushPostedRecv(q)
	}
	for i := 0; i < len(e.overrun); i++ { // failing users may overrun more CQs
		d.failCQUsers(e.overrun[i])
	}
	clear(e.overrun)
	e.overrun = e.overrun[:0]
	for _, q := range e.cqLost {
		d.failCQUser(q)
	}
	clear(e.cqLost)
	e.cqLost = e.cqLost[:0]
	for _, q := range e.acks {
		if !q.destroyed {
			d.sendAck(q)
		}
		q.resp.ackDue = false
	}
	e.acks = e.acks[:0]
	e.armTimer(now)
	return worked
}

// errPoll is how often the engine looks for receive WQEs posted to QPs in
// the error state, which ring no doorbell.
const errPoll = time.Millisecond

// armTimer makes sure the clock wakes the engine for the earliest timer.
func (e *engine) armTimer(now time.Time) {
	var at time.Time
	if len(e.timers) > 0 {
		// The earliest entry of the heap: no QP's timer fires before it
		// (it may fire later, or not at all: the round that finds it due
		// sorts that out).
		at = e.time(e.timers[0].req.heapAt)
	}
	if len(e.errq) > 0 && (at.IsZero() || at.After(now.Add(errPoll))) {
		at = now.Add(errPoll)
	}
	if at.IsZero() {
		return
	}
	if e.timer != nil && !e.timerAt.After(at) && e.timerAt.After(now) {
		return // an earlier or equal wake-up is already set
	}
	e.timerAt = at
	if e.timer == nil {
		e.timer = e.d.clock.AfterFunc(at.Sub(now), e.kick)
	} else {
		e.timer.Reset(at.Sub(now))
	}
}

// setTimer (re)starts a QP's requester timer; a zero time cancels it.
// Caller holds d.mu.
//
// The heap is updated lazily, since the data path moves a timer on every
// message (armed when a request goes out, moved or cancelled when its
// acknowledgement comes): a QP is in the heap at most once, queued at
// heapAt, which is never later than its deadline timerAt. Cancelling or
// moving the deadline later leaves the heap alone; the round that finds
// the entry due drops it or queues it again at the new deadline. Only a
// deadline earlier than the queued one touches the heap.
func (e *engine) setTimer(q *qp, at instant) {
	r := &q.req
	r.timerAt = at
	switch {
	case at == 0:
	case r.heapIdx < 0:
		r.heapAt = at
		heap.Push(&e.timers, q)
	case at < r.heapAt:
		r.heapAt = at
		heap.Fix(&e.timers, int(r.heapIdx))
	}
}

// lateSlack is the least lateness that makes a transport timer late (see
// Device.timeout): Go's timers, which wake a sleeping engine, may fire a
// millisecond or so after their time on their own.
const lateSlack = 4 * time.Millisecond

// fireTimers runs the timers due at now, and drops or queues again the
// heap entries of timers cancelled or moved later. It reports whether a
// timer fired. Caller holds d.mu.
func (e *engine) fireTimers(now instant) bool {
	fired := false
	for len(e.timers) > 0 && e.timers[0].req.heapAt <= now {
		q := e.timers[0]
		r := &q.req
		switch {
		case r.timerAt == 0: // cancelled since it was queued
			heap.Pop(&e.timers)
		case r.timerAt > now: // moved later since it was queued
			r.heapAt = r.timerAt
			heap.Fix(&e.timers, 0)
		default:
			heap.Pop(&e.timers)
			fired = true
			e.d.timeout(q, now)
		}
	}
	return fired
}

// cancelTimer stops a QP's timer and takes it out of the heap at once,
// for a QP that is reset, fails or goes away: the heap holds no QP that
// has no use for it. Caller holds d.mu.
func (e *engine) cancelTimer(q *qp) {
	r := &q.req
	r.timerAt = 0
	if r.heapIdx >= 0 {
		heap.Remove(&e.timers, int(r.heapIdx))
	}
}

// watchErr keeps the list of QPs whose receive queue is flushed each round
// in step with their state: those in the error state, not destroyed, with
// a receive queue. Caller holds d.mu.
func (e *engine) watchErr(q *qp) {
	want := q.state == qpstate.Err && !q.destroyed && q.rqDB != nil && q.srq == nil
	if want == q.inErrq {
		return
	}
	q.inErrq = want
	if want {
		e.errq = append(e.errq, q)
		e.kick()
	} else {
		e.errq = slices.DeleteFunc(e.errq, func(x *qp) bool { return x == q })
	}
}

// send queues a packet for transmission after the round, through the
// fault injector. Caller holds d.mu.
func (e *engine) send(p *roce.Packet) {
	e.out = e.faults.apply(e.d, p, e.out)
}

func (e *engine) flushOut() {
	// A packet held back for reordering goes after the next one sent in
	// the round, or at the round's end: it is reordered, not lost until
	// the device happens to send again.
	e.out = e.faults.release(e.out)
	e.d.transmit(e.out, &e.pkts)
	clear(e.out)
	e.out = e.out[:0]
}

// transmit puts packets on the link, in order, or drops them if the port
// is down. It takes their ownership; the packets it frees go to c, the
// packet cache of the calling goroutine (nil: the shared pool).
func (d *Device) transmit(ps []*roce.Packet, c *pktCache) {
	if len(ps) == 0 {
		return
	}
	if !d.portUp.Load() { // nothing leaves a port that is down
		for _, p := range ps {
			c.put(p)
		}
		return
	}
	d.counters.XmitPackets.Add(uint64(len(ps)))
	var words uint64
	for _, p := range ps {
		words += d.wireWords(p)
	}
	d.counters.XmitData.Add(words)
	d.link.sendBatch(ps, c)
}

// timerHeap orders the QPs whose timer is queued by heapAt.
type timerHeap []*qp

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].req.heapAt < h[j].req.heapAt }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].req.heapIdx, h[j].req.heapIdx = int32(i), int32(j)
}
func (h *timerHeap) Push(x any) {
	q := x.(*qp)
	q.req.heapIdx = int32(len(*h))
	*h = append(*h, q)
}
func (h *timerHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = nil
	q.req.heapIdx = -1
	*h = old[:len(old)-1]
	return q
}

// The packet pool: packets carry up to 4096 bytes of payload in their
// Storage (see freshPacket); a received packet's Payload may instead point
// into the datagram it came in, valid until the round that processes it
// ends. Unlike a
// sync.Pool it survives garbage collections, so a steady stream of traffic
// allocates nothing; it keeps at most poolMax packets.
//
// Each engine keeps a cache of its own in front of it (pktCache), so that
// the data path takes no lock per packet: packets travel from one device's
// engine to another's, so a cache that runs empty takes a batch from the
// shared pool, and one that overflows gives a batch back. Goroutines other
// than an engine's (timers sending delayed packets) use the shared pool.
var packets struct {
	mu   sync.Mutex
	free []*roce.Packet
}

const (
	poolMax    = 4096
	cacheBatch = 64 // packets an engine's cache exchanges with the pool at once
)

// getPacket takes a packet from the shared pool.
func getPacket() *roce.Packet {
	packets.mu.Lock()
	var p *roce.Packet
	if n := len(packets.free); n > 0 {
		p = packets.free[n-1]
		packets.free[n-1] = nil
		packets.free = packets.free[:n-1]
	}
	packets.mu.Unlock()
	return freshPacket(p)
}

// A packet's storage has room for the transport headers before the payload
// and for its pad and ICRC after it, so that the UDP link encodes a packet
// where it is.
const (
	pktHeadroom = 64
	pktTailroom = 8
	pktStorage  = pktHeadroom + 4096 + pktTailroom
)

// freshPacket clears p (or makes a packet, if nil), its empty payload at
// the start of its storage's payload room.
func freshPacket(p *roce.Packet) *roce.Packet {
	if p == nil {
		p = &roce.Packet{Storage: make([]byte, pktStorage)}
	}
	st := p.Storage
	*p = roce.Packet{Storage: st, Payload: st[pktHeadroom:pktHeadroom]}
	return p
}

// inStorage reports whether p's payload lies in the packet's own storage.
func inStorage(p *roce.Packet) bool {
	st := p.Storage[:cap(p.Storage)]
	if len(st) == 0 || len(p.Payload) == 0 {
		return false
	}
	d := uintptr(unsafe.Pointer(unsafe.SliceData(p.Payload))) - uintptr(unsafe.Pointer(unsafe.SliceData(st)))
	return d < uintptr(len(st))
}

// own copies a payload that lies outside the packet's storage (borrowed
// from a region, or in a link's receive buffer) into the storage, for a
// packet kept beyond the round.
func own(p *roce.Packet) {
	if len(p.Payload) == 0 || inStorage(p) {
		return
	}
	st := p.Storage[:cap(p.Storage)]
	p.Payload = append(st[pktHeadroom:pktHeadroom], p.Payload...)
	racedma.Release()
}

// putPacket returns a packet to the shared pool.
func putPacket(p *roce.Packet) {
	packets.mu.Lock()
	if len(packets.free) < poolMax {
		packets.free = append(packets.free, p)
	}
	packets.mu.Unlock()
}

// pktCache is an engine's own free list of packets, in front of the shared
// pool. Only the engine's goroutine uses it. A nil cache is the shared
// pool.
type pktCache struct {
	free []*roce.Packet
}

// get returns a cleared packet.
func (c *pktCache) get() *roce.Packet {
	if c == nil {
		return getPacket()
	}
	if len(c.free) == 0 {
		c.refill()
	}
	n := len(c.free)
	if n == 0 {
		return freshPacket(nil)
	}
	p := c.free[n-1]
	c.free[n-1] = nil
	c.free = c.free[:n-1]
	return freshPacket(p)
}

// put takes a packet back. The cache keeps up to 2*cacheBatch packets and
// gives the older half back to the shared pool when it has more.
func (c *pktCache) put(p *roce.Packet) {
	if c == nil {
		putPacket(p)
		return
	}
	if len(c.free) >= 2*cacheBatch {
		c.spill(cacheBatch)
	}
	c.free = append(c.free, p)
}

// refill takes up to cacheBatch packets from the shared pool.
func (c *pktCache) refill() {
	packets.mu.Lock()
	n := min(len(packets.free), cacheBatch)
	rest := len(packets.free) - n
	c.free = append(c.free, packets.free[rest:]...)
	clear(packets.free[rest:])
	packets.free = packets.free[:rest]
	packets.mu.Unlock()
}

// spill gives n packets (the ones longest in the cache) to the shared
// pool, which drops those beyond poolMax.
func (c *pktCache) spill(n int) {
	n = min(n, len(c.free))
	packets.mu.Lock()
	room := max(poolMax-len(packets.free), 0)
	packets.free = append(packets.free, c.free[:min(n, room)]...)
	packets.mu.Unlock()
	k := copy(c.free, c.free[n:])
	clear(c.free[k:])
	c.free = c.free[:k]
}
