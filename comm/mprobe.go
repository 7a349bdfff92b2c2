package comm

import (
	"context"
	"errors"
	"sync/atomic"
)

// Message is a message that Mprobe or Improbe took out of the matching
// (MPI's matched probe): no receive can match it any more, and only its
// own Recv or Irecv receives it. Goroutines that probe one communicator
// at once, each to size its buffer before it receives, never take each
// other's messages, as they may with Probe and then Recv.
type Message struct {
	c        *Comm
	m        *inMsg
	st       Status
	received atomic.Bool
}

// Status describes the message: its source, tag and length.
func (msg *Message) Status() Status { return msg.st }

// Mprobe waits until a message from src (or AnySource) with tag (or
// AnyTag) has come, and takes it.
func (c *Comm) Mprobe(ctx context.Context, src, tag int) (*Message, error) {
	var msg *Message
	var err error
	// await may ask again once the condition holds: take once.
	if werr := c.e.await(ctx, func() bool {
		if msg == nil && err == nil {
			msg, err = c.take(src, tag)
		}
		return msg != nil || err != nil
	}, func() []<-chan struct{} { return []<-chan struct{}{c.e.arrived} }); werr != nil && msg == nil {
		return nil, werr
	}
	return msg, err
}

// Improbe progresses once and takes a message from src with tag if one
// has come; it returns nil if none has.
func (c *Comm) Improbe(src, tag int) (*Message, error) {
	c.e.progressOnce()
	return c.take(src, tag)
}

// take removes the first message that matches src and tag from the
// messages come before their receive, if there is one.
func (c *Comm) take(src, tag int) (*Message, error) {
	m, err := c.probe(src, tag, true)
	if m == nil || err != nil {
		return nil, err
	}
	return &Message{c: c, m: m, st: m.status()}, nil
}

// Irecv starts receiving the message into buf (MPI_Imrecv); a message
// longer than buf fills it and completes with ErrTruncate. A message is
// received once.
func (msg *Message) Irecv(buf []byte) (*Request, error) {
	c := msg.c
	e := c.e
	e.mu.Lock()
	defer e.mu.Unlock()
	// Matched already: a communicator freed since does not stop it.
	if e.closed {
		return nil, ErrFinalized
	}
	if !msg.received.CompareAndSwap(false, true) {
		return nil, errors.New("comm: the message was received already")
	}
	r := newRequest(e)
	r.c, r.buf, r.src, r.tag = c, buf, msg.st.Source, msg.st.Tag
	e.deliverTo(r, msg.m, nil)
	msg.m = nil
	return r, nil
}

// Recv receives the message into buf (MPI_Mrecv). The message is matched
// already, so, as for a Recv that has matched, ctx does not end the wait
// for a large one: the job's end does.
func (msg *Message) Recv(ctx context.Context, buf []byte) (Status, error) {
	r, err := msg.Irecv(buf)
	if err != nil {
		return Status{}, err
	}
	return r.Wait(context.WithoutCancel(ctx))
}
