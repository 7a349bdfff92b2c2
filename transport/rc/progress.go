package rc

import "github.com/xrcrun/xrc/transport"

// Progress polls the CQ: it delivers received frames to h (in the order
// each peer sent them: one QP per peer, in order), takes credits back,
// frees send buffers, finishes reads (ReadDone), then reposts receive
// buffers, posts waiting reads and returns credits. With lazy connection
// it first connects the QPs whose requests came. The handler may call
// TrySend and Read. It returns how many frames and reads it delivered.
func (t *Transport) Progress(h transport.Handler) (int, error) { return t.e.Progress(h) }

// Arm asks for a Kick at the next completion (transport.Armer): call it
// before sleeping, then Progress once more.
func (t *Transport) Arm() error { return t.e.Arm() }

// WakeFD is the CQ's completion channel (transport.Armer).
func (t *Transport) WakeFD() int { return t.e.WakeFD() }
