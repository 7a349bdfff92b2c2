package bootstrap

import (
	"encoding/binary"
	"math"
)

// message is one message of the protocol. decode reads what encode
// writes; fields that are byte strings alias the decoded payload.
type message interface {
	typ() msgType
	encode(*encoder)
	decode(*decoder)
}

// decodeMessage decodes a frame's payload of type t. The message's byte
// strings alias p. Every error wraps ErrProtocol.
func decodeMessage(t msgType, p []byte) (message, error) {
	var m message
	switch t {
	case tHello:
		m = &msgHello{}
	case tChallenge:
		m = &msgChallenge{}
	case tAuth:
		m = &msgAuth{}
	case tRegister:
		m = &msgRegister{}
	case tReject:
		m = &msgReject{}
	case tReady:
		m = &msgReady{}
	case tGather:
		m = &msgGather{}
	case tGathered:
		m = &msgGathered{}
	case tPut:
		m = &msgPut{}
	case tPutDone:
		m = &msgPutDone{}
	case tGet:
		m = &msgGet{}
	case tGot:
		m = &msgGot{}
	case tAbort:
		m = &msgAbort{}
	case tLeave:
		m = &msgLeave{}
	case tCancel:
		m = &msgCancel{}
	default:
		return nil, protoErr("unknown_type", "unknown message type %d", uint8(t))
	}
	d := decoder{b: p, t: t}
	m.decode(&d)
	if err := d.end(); err != nil {
		return nil, err
	}
	return m, nil
}

// expect decodes p as a message of type want, or fails.
func expect[M message](t msgType, p []byte, want msgType) (M, error) {
	var zero M
	if t != want {
		return zero, protoErr("unexpected", "got a %v message where a %v belongs", t, want)
	}
	m, err := decodeMessage(t, p)
	if err != nil {
		return zero, err
	}
	return m.(M), nil
}

// expectOrReject reads the server's next message from fc (at most limit
// bytes): one of type want, or a rejection, which it returns as its error.
func expectOrReject[M message](fc *frameConn, limit int, want msgType) (M, error) {
	var zero M
	t, p, err := fc.read(limit)
	if err != nil {
		return zero, err
	}
	if t == tReject {
		rej, err := expect[*msgReject](t, p, tReject)
		if err != nil {
			return zero, err
		}
		return zero, rejectError(rej)
	}
	return expect[M](t, p, want)
}

type msgHello struct {
	Magic   [4]byte
	Version uint16
	Nonce   [nonceLen]byte
}

func (*msgHello) typ() msgType { return tHello }
func (m *msgHello) encode(e *encoder) {
	e.raw(m.Magic[:])
	e.u16(m.Version)
	e.raw(m.Nonce[:])
}
func (m *msgHello) decode(d *decoder) {
	copy(m.Magic[:], d.take(4))
	m.Version = d.u16()
	copy(m.Nonce[:], d.take(nonceLen))
}

type msgChallenge struct {
	Magic   [4]byte
	Version uint16
	Nonce   [nonceLen]byte
	Proof   [proofLen]byte // the server's proof that it holds the key
}

func (*msgChallenge) typ() msgType { return tChallenge }
func (m *msgChallenge) encode(e *encoder) {
	e.raw(m.Magic[:])
	e.u16(m.Version)
	e.raw(m.Nonce[:])
	e.raw(m.Proof[:])
}
func (m *msgChallenge) decode(d *decoder) {
	copy(m.Magic[:], d.take(4))
	m.Version = d.u16()
	copy(m.Nonce[:], d.take(nonceLen))
	copy(m.Proof[:], d.take(proofLen))
}

type msgAuth struct{ Proof [proofLen]byte }

func (*msgAuth) typ() msgType        { return tAuth }
func (m *msgAuth) encode(e *encoder) { e.raw(m.Proof[:]) }
func (m *msgAuth) decode(d *decoder) { copy(m.Proof[:], d.take(proofLen)) }

type msgRegister struct {
	Rank, Size, Node, LocalRank uint32
	Endpoint                    []byte
}

func (*msgRegister) typ() msgType { return tRegister }
func (m *msgRegister) encode(e *encoder) {
	e.u32(m.Rank)
	e.u32(m.Size)
	e.u32(m.Node)
	e.u32(m.LocalRank)
	e.bytes(m.Endpoint)
}
func (m *msgRegister) decode(d *decoder) {
	m.Rank, m.Size, m.Node, m.LocalRank = d.u32(), d.u32(), d.u32(), d.u32()
	m.Endpoint = d.bytes(MaxRecord)
	for _, v := range []uint32{m.Rank, m.Size, m.Node, m.LocalRank} {
		if v > math.MaxInt32 {
			d.fail("number %d out of range", v)
		}
	}
}

// Reasons for a rejection, which the client maps to its errors.
const (
	rejectAuth     = 1 // ErrAuth
	rejectProtocol = 2 // ErrProtocol
	rejectRegister = 3 // ErrRejected
	rejectAborted  = 4 // ErrAborted
)

type msgReject struct {
	Code uint8
	Text string
}

func (*msgReject) typ() msgType { return tReject }
func (m *msgReject) encode(e *encoder) {
	e.u8(m.Code)
	e.str(m.Text)
}
func (m *msgReject) decode(d *decoder) {
	m.Code = d.u8()
	m.Text = d.str(maxReason)
	if m.Code < rejectAuth || m.Code > rejectAborted {
		d.fail("unknown rejection %d", m.Code)
	}
}

type msgReady struct{ Members []Member }

func (*msgReady) typ() msgType { return tReady }
func (m *msgReady) encode(e *encoder) {
	e.u32(uint32(len(m.Members)))
	for _, x := range m.Members {
		e.u32(uint32(x.Rank))
		e.u32(uint32(x.Node))
		e.u32(uint32(x.LocalRank))
		e.bytes(x.Endpoint)
	}
}
func (m *msgReady) decode(d *decoder) {
	n := d.count(16)
	m.Members = make([]Member, n)
	for i := range m.Members {
		r, node, lr := d.u32(), d.u32(), d.u32()
		ep := d.bytes(MaxRecord)
		if r != uint32(i) || node > math.MaxInt32 || lr > math.MaxInt32 {
			d.fail("member %d: rank %d, node %d, local rank %d", i, r, node, lr)
			return
		}
		m.Members[i] = Member{Rank: int(r), Node: int(node), LocalRank: int(lr), Endpoint: ep}
	}
}

// Kinds of collective.
const (
	kindAllGather = 1
	kindBarrier   = 2
)

func kindName(k uint8) string {
	switch k {
	case kindAllGather:
		return "AllGather"
	case kindBarrier:
		return "Barrier"
	}
	return "an unknown collective"
}

// msgGather is a rank's part of the collective numbered Seq: every rank's
// collectives are numbered 0, 1, 2... in the order it calls them.
type msgGather struct {
	Seq  uint64
	Kind uint8
	Rec  []byte
}

func (*msgGather) typ() msgType { return tGather }
func (m *msgGather) encode(e *encoder) {
	e.u64(m.Seq)
	e.u8(m.Kind)
	e.bytes(m.Rec)
}
func (m *msgGather) decode(d *decoder) {
	m.Seq, m.Kind = d.u64(), d.u8()
	m.Rec = d.bytes(MaxRecord)
	if m.Kind != kindAllGather && m.Kind != kindBarrier {
		d.fail("unknown collective %d", m.Kind)
	}
	if m.Kind == kindBarrier && len(m.Rec) != 0 {
		d.fail("a barrier with a record")
	}
}

// msgGathered is the result of collective Seq: a record per rank for an
// all-gather, none for a barrier.
type msgGathered struct {
	Seq  uint64
	Recs [][]byte
}

func (*msgGathered) typ() msgType { return tGathered }
func (m *msgGathered) encode(e *encoder) {
	e.u64(m.Seq)
	e.u32(uint32(len(m.Recs)))
	for _, r := range m.Recs {
		e.bytes(r)
	}
}
func (m *msgGathered) decode(d *decoder) {
	m.Seq = d.u64()
	if n := d.count(4); n > 0 {
		m.Recs = make([][]byte, n)
		for i := range m.Recs {
			m.Recs[i] = d.bytes(MaxRecord)
		}
	}
}

type msgPut struct {
	ID  uint64
	Key string
	Val []byte
}

func (*msgPut) typ() msgType { return tPut }
func (m *msgPut) encode(e *encoder) {
	e.u64(m.ID)
	e.str(m.Key)
	e.bytes(m.Val)
}
func (m *msgPut) decode(d *decoder) {
	m.ID = d.u64()
	m.Key = d.str(MaxKey)
	m.Val = d.bytes(MaxRecord)
}

type msgPutDone struct {
	ID  uint64
	Err string // empty: stored
}

func (*msgPutDone) typ() msgType { return tPutDone }
func (m *msgPutDone) encode(e *encoder) {
	e.u64(m.ID)
	e.str(m.Err)
}
func (m *msgPutDone) decode(d *decoder) {
	m.ID = d.u64()
	m.Err = d.str(MaxKey + 256)
}

type msgGet struct {
	ID  uint64
	Key string
}

func (*msgGet) typ() msgType { return tGet }
func (m *msgGet) encode(e *encoder) {
	e.u64(m.ID)
	e.str(m.Key)
}
func (m *msgGet) decode(d *decoder) {
	m.ID = d.u64()
	m.Key = d.str(MaxKey)
}

// msgCancel withdraws the get of request ID: its caller stopped waiting.
type msgCancel struct {
	ID uint64
}

func (*msgCancel) typ() msgType        { return tCancel }
func (m *msgCancel) encode(e *encoder) { e.u64(m.ID) }
func (m *msgCancel) decode(d *decoder) { m.ID = d.u64() }

type msgGot struct {
	ID  uint64
	Val []byte
}

func (*msgGot) typ() msgType { return tGot }
func (m *msgGot) encode(e *encoder) {
	e.u64(m.ID)
	e.bytes(m.Val)
}
func (m *msgGot) decode(d *decoder) {
	m.ID = d.u64()
	m.Val = d.bytes(MaxRecord)
}

// gotFrame returns the frame of msgGot{ID: id, Val: val} in two parts, all
// of it before the value, and the value itself, so that the answers to
// many gets of one value share its bytes instead of each copying them.
func gotFrame(id uint64, val []byte) (head, body []byte) {
	head = appendFrame(nil, &msgGot{ID: id})
	binary.BigEndian.PutUint32(head[1:], uint32(len(head)-headerLen+len(val)))
	binary.BigEndian.PutUint32(head[len(head)-4:], uint32(len(val)))
	return head, val
}

// msgAbort from a rank asks to abort the job (Rank, Lost and Blamed are
// ignored); from the server it tells that the job is aborted. On the wire
// Lost and Blamed are one byte: 0 (the rank called Abort), 1 (lost) or
// 2 (blamed).
type msgAbort struct {
	Rank   int32 // -1: the launcher
	Lost   bool
	Blamed bool
	Reason string
}

// maxReason is the longest abort reason carried; longer ones are cut.
const maxReason = 4096

// The abort's cause byte.
const (
	abortCalled = 0
	abortLost   = 1
	abortBlamed = 2
)

func (*msgAbort) typ() msgType { return tAbort }
func (m *msgAbort) encode(e *encoder) {
	e.u32(uint32(m.Rank))
	cause := uint8(abortCalled)
	switch {
	case m.Lost:
		cause = abortLost
	case m.Blamed:
		cause = abortBlamed
	}
	e.u8(cause)
	e.str(m.Reason)
}
func (m *msgAbort) decode(d *decoder) {
	m.Rank = int32(d.u32())
	switch d.u8() {
	case abortCalled:
	case abortLost:
		m.Lost = true
	case abortBlamed:
		m.Blamed = true
	default:
		d.fail("bad cause")
	}
	m.Reason = d.str(maxReason)
	if m.Rank < -1 {
		d.fail("rank %d", m.Rank)
	}
}

type msgLeave struct{}

func (*msgLeave) typ() msgType    { return tLeave }
func (*msgLeave) encode(*encoder) {}
func (*msgLeave) decode(*decoder) {}

// cut shortens s to at most n bytes, for reasons and texts on the wire.
func cut(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
