package rc

import (
	"context"

	"github.com/xrcrun/xrc/verbs"
)

// watchCQ wakes the rank when a completion arrives: it arms the CQ, kicks
// (so that the rank polls after the arm, and sees a completion that came
// before it), and waits for the CQ's event, until ctx ends.
func (t *Transport) watchCQ(ctx context.Context) {
	for {
		if err := t.cq.RequestNotify(false); err != nil {
			if ctx.Err() == nil {
				t.log.Error("arm CQ", "err", err)
			}
			return
		}
		t.cfg.Kick()
		if _, err := t.ch.GetEvent(ctx); err != nil {
			if ctx.Err() == nil {
				t.log.Error("CQ events", "err", err)
			}
			return
		}
		t.m.cqEvents.Inc()
	}
}

// watchEvents handles the device's async events until ctx ends. The SRQ
// limit event means the peers' frames use up the receive buffers faster
// than the rank delivers them (possible when the credits overcommit the
// SRQ): it posts the free buffers at once and wakes the rank, whose
// Progress arms the limit again when the SRQ is above it. QP errors are logged; their completions fail the peer.
func (t *Transport) watchEvents(ctx context.Context) {
	for {
		ev, err := t.cfg.Device.GetAsyncEvent(ctx)
		if err != nil {
			if ctx.Err() == nil {
				t.log.Error("async events", "err", err)
			}
			return
		}
		switch ev.Type {
		case verbs.EventSRQLimitReached:
			t.m.srqLimit.Inc()
			if _, err := t.recv.refill(); err != nil {
				t.log.Error("SRQ limit: refill", "err", err)
			}
			// Progress arms it again once it has buffers to post:
			// armed below the limit, it would fire at once, again and
			// again, while the rank does not progress.
			t.recv.fired.Store(true)
			t.cfg.Kick()
		case verbs.EventQPFatal, verbs.EventQPReqErr, verbs.EventQPAccessErr, verbs.EventSRQErr,
			verbs.EventCQErr, verbs.EventDeviceFatal, verbs.EventPortErr:
			t.m.asyncErrors.Inc()
			qpn := uint32(0)
			if ev.QP != nil {
				qpn = ev.QP.Num()
			}
			t.log.Error("device event", "event", ev.Type, "qpn", qpn)
			t.cfg.Kick()
		default:
			t.log.Debug("device event", "event", ev.Type)
		}
	}
}
