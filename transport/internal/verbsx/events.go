package verbsx

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/xrcrun/xrc/verbs"
)

// WatchCQ wakes the rank when a completion arrives on a CQ that the rank
// armed (Endpoint.Arm) before it went to sleep: it waits for the CQ's
// events on ch, and for each one clears armed (the event disarmed the CQ)
// and calls kick, until ctx ends. Run it as a goroutine.
//
// It does not arm the CQ itself. Kept armed, every completion that came
// while the rank polled cost the device an event (a write on the
// channel's socket, for a software HCA in another process) and the rank
// a thread woken to read it, which on a machine with fewer CPUs than busy
// processes took the CPU from the devices that carry the next message: an
// 8-byte message between two emulated nodes took 120-160 µs one way, 55-90
// µs with no events.
func WatchCQ(ctx context.Context, ch *verbs.CompChannel, armed *atomic.Bool, kick func(), log *slog.Logger, m *Metrics) {
	for {
		if _, err := ch.GetEvent(ctx); err != nil {
			if ctx.Err() == nil {
				log.Error("CQ events", "err", err)
			}
			return
		}
		m.CQEvents.Inc()
		armed.Store(false)
		kick()
	}
}

// WatchEvents handles dev's async events until ctx ends (run it as a
// goroutine; it must be the device context's only reader). The SRQ limit
// event means the peers' frames use up the receive buffers faster than the
// rank delivers them (possible when the credits overcommit the SRQ): it
// posts the free buffers at once and wakes the rank, whose Progress arms
// the limit again (RecvPool.Rearm). Errors are logged and wake the rank;
// QP errors (QP_FATAL, QP_REQ_ERR and QP_ACCESS_ERR, the QP having gone to
// the error state) are handed to qpErr, and the errors that end all of the
// rank's traffic to devErr: DEVICE_FATAL (the device is gone: every QP is
// in the error state and nothing more completes) and CQ_ERR of cq (the
// rank's one CQ overran: completions were lost, so the accounting of
// every QP's work, credits and buffers can no longer be trusted, and the
// device may complete nothing more).
func WatchEvents(ctx context.Context, dev *verbs.Context, recv *RecvPool, cq *verbs.CQ, qpErr func(qpn uint32, ev verbs.EventType),
	devErr func(ev verbs.EventType), kick func(), log *slog.Logger, m *Metrics) {
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
			switch ev.Type {
			case verbs.EventQPFatal, verbs.EventQPReqErr, verbs.EventQPAccessErr:
				if ev.QP != nil {
					qpErr(qpn, ev.Type)
				}
			case verbs.EventDeviceFatal:
				devErr(ev.Type)
			case verbs.EventCQErr:
				if ev.CQ == cq {
					devErr(ev.Type)
				}
			}
			kick()
		default:
			log.Debug("device event", "event", ev.Type)
		}
	}
}
