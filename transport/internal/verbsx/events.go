package verbsx

import (
	"context"
	"log/slog"

	"github.com/xrcrun/xrc/verbs"
)

// WatchCQ wakes the rank when a completion arrives on cq: it arms the CQ,
// calls kick (so that the rank polls after the arm, and sees a completion
// that came before it), and waits for the CQ's event on ch, until ctx
// ends. Run it as a goroutine.
func WatchCQ(ctx context.Context, cq *verbs.CQ, ch *verbs.CompChannel, kick func(), log *slog.Logger, m *Metrics) {
	for {
		if err := cq.RequestNotify(false); err != nil {
			if ctx.Err() == nil {
				log.Error("arm CQ", "err", err)
			}
			return
		}
		kick()
		if _, err := ch.GetEvent(ctx); err != nil {
			if ctx.Err() == nil {
				log.Error("CQ events", "err", err)
			}
			return
		}
		m.CQEvents.Inc()
	}
}

// WatchEvents handles dev's async events until ctx ends (run it as a
// goroutine; it must be the device context's only reader). The SRQ limit
// event means the peers' frames use up the receive buffers faster than the
// rank delivers them (possible when the credits overcommit the SRQ): it
// posts the free buffers at once and wakes the rank, whose Progress arms
// the limit again (RecvPool.Rearm). QP errors are logged and wake the
// rank; their completions fail the peers.
func WatchEvents(ctx context.Context, dev *verbs.Context, recv *RecvPool, kick func(), log *slog.Logger, m *Metrics) {
	for {
		ev, err := dev.GetAsyncEvent(ctx)
		if err != nil {
			if ctx.Err() == nil {
				log.Error("async events", "err", err)
			}
			return
		}
		switch ev.Type {
		case verbs.EventSRQLimitReached:
			m.SRQLimit.Inc()
			if err := recv.OnLimit(); err != nil {
				log.Error("SRQ limit: refill", "err", err)
			}
			kick()
		case verbs.EventQPFatal, verbs.EventQPReqErr, verbs.EventQPAccessErr, verbs.EventSRQErr,
			verbs.EventCQErr, verbs.EventDeviceFatal, verbs.EventPortErr:
			m.AsyncErrors.Inc()
			qpn := uint32(0)
			if ev.QP != nil {
				qpn = ev.QP.Num()
			}
			log.Error("device event", "event", ev.Type, "qpn", qpn)
			kick()
		default:
			log.Debug("device event", "event", ev.Type)
		}
	}
}
