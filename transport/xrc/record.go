package xrc

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/xrcrun/xrc/transport/internal/verbsx"
	"github.com/xrcrun/xrc/verbs"
)

// A record is what a rank publishes for the others before Connect: the
// header of verbsx.NewRecord (version, MTU, number of ranks n, GID), then
//
//	24  the number of the rank's XRC SRQ (u32)
//	28  number of INI entries i (u32)
//	32  number of TGT entries g (u32)
//	36  i × (node u32, QPN u32, PSN u32): the rank's INI QP toward each
//	    other node and its first send PSN
//	    g × (rank u32, QPN u32): the TGT QPs this rank created on its
//	    node, each for the INI QP of rank toward this node
//
// With lazy connection a record has no entries: the QPs are made on
// demand (lazy.go).
const recordHdr = verbsx.RecordHeader + 12

type iniEntry struct{ node, qpn, psn uint32 }

type tgtEntry struct{ rank, qpn uint32 }

// record is a decoded record.
type record struct {
	mtu  verbs.MTU
	gid  verbs.GID
	srqn uint32
	inis []iniEntry
	tgts []tgtEntry
}

// errRecord reports a record or connection message that does not decode.
var errRecord = errors.New("xrc: malformed record")

func (r *record) encode(n int) []byte {
	b := verbsx.NewRecord(r.mtu, r.gid, n, recordHdr, recordHdr+12*len(r.inis)+8*len(r.tgts))
	binary.LittleEndian.PutUint32(b[24:], r.srqn)
	binary.LittleEndian.PutUint32(b[28:], uint32(len(r.inis)))
	binary.LittleEndian.PutUint32(b[32:], uint32(len(r.tgts)))
	for _, e := range r.inis {
		b = binary.LittleEndian.AppendUint32(b, e.node)
		b = binary.LittleEndian.AppendUint32(b, e.qpn)
		b = binary.LittleEndian.AppendUint32(b, e.psn)
	}
	for _, e := range r.tgts {
		b = binary.LittleEndian.AppendUint32(b, e.rank)
		b = binary.LittleEndian.AppendUint32(b, e.qpn)
	}
	return b
}

// parseRecord decodes b, the record of a rank of a job of n ranks.
func parseRecord(b []byte, n int) (*record, error) {
	r := &record{}
	var err error
	if r.mtu, r.gid, err = verbsx.ParseRecordHeader(b, n, recordHdr, errRecord); err != nil {
		return nil, err
	}
	if r.srqn = binary.LittleEndian.Uint32(b[24:]); !validNum(r.srqn) {
		return nil, fmt.Errorf("%w: SRQ number %#x", errRecord, r.srqn)
	}
	ni, ng := uint64(binary.LittleEndian.Uint32(b[28:])), uint64(binary.LittleEndian.Uint32(b[32:]))
	if ni > uint64(n) || ng > uint64(n) || uint64(len(b)) != recordHdr+12*ni+8*ng {
		return nil, fmt.Errorf("%w: %d bytes for %d INI and %d TGT entries", errRecord, len(b), ni, ng)
	}
	p := b[recordHdr:]
	for range ni {
		e := iniEntry{binary.LittleEndian.Uint32(p), binary.LittleEndian.Uint32(p[4:]), binary.LittleEndian.Uint32(p[8:])}
		if e.node >= verbsx.MaxRanks || !validNum(e.qpn) || e.psn >= 1<<24 {
			return nil, fmt.Errorf("%w: INI QP %#x, PSN %#x toward node %d", errRecord, e.qpn, e.psn, e.node)
		}
		r.inis, p = append(r.inis, e), p[12:]
	}
	for range ng {
		e := tgtEntry{binary.LittleEndian.Uint32(p), binary.LittleEndian.Uint32(p[4:])}
		if e.rank >= uint32(n) || !validNum(e.qpn) {
			return nil, fmt.Errorf("%w: TGT QP %#x for rank %d", errRecord, e.qpn, e.rank)
		}
		r.tgts, p = append(r.tgts, e), p[8:]
	}
	return r, nil
}

// validNum reports whether x can be a QP or SRQ number (24 bits, not 0).
func validNum(x uint32) bool { return x != 0 && x < 1<<24 }

// ini is the rank's INI entry toward node, or false.
func (r *record) ini(node int) (iniEntry, bool) {
	for _, e := range r.inis {
		if int(e.node) == node {
			return e, true
		}
	}
	return iniEntry{}, false
}

// tgt is the number of the TGT QP the rank created for rank's INI QP, or 0.
func (r *record) tgt(rank int) uint32 {
	for _, e := range r.tgts {
		if int(e.rank) == rank {
			return e.qpn
		}
	}
	return 0
}

// Lazy connection messages, put in a rank's mailbox (lazy.go):
//
//	0   kind (u8): 1 request, 2 reply, 3 refusal; 3 reserved bytes
//	4   the sender's rank (u32)
//	8   request: the sender's INI QPN toward the receiver's node;
//	    reply: the TGT QPN, on the sender's node, of the receiver's INI;
//	    refusal: the receiver's INI QPN, whose TGT QP the sender could
//	    not create or open
//	12  request: the INI QP's first send PSN; otherwise 0
const (
	msgLen     = 16
	msgRequest = 1
	msgReply   = 2
	msgRefusal = 3
)

type message struct {
	kind     uint8
	rank     int
	qpn, psn uint32
}

func (m message) encode() []byte {
	b := make([]byte, msgLen)
	b[0] = m.kind
	binary.LittleEndian.PutUint32(b[4:], uint32(m.rank))
	binary.LittleEndian.PutUint32(b[8:], m.qpn)
	binary.LittleEndian.PutUint32(b[12:], m.psn)
	return b
}

func parseMessage(b []byte, n int) (message, error) {
	if len(b) != msgLen || b[0] < msgRequest || b[0] > msgRefusal || b[1]|b[2]|b[3] != 0 {
		return message{}, fmt.Errorf("%w: connection message of %d bytes", errRecord, len(b))
	}
	m := message{kind: b[0], rank: int(binary.LittleEndian.Uint32(b[4:])), qpn: binary.LittleEndian.Uint32(b[8:]),
		psn: binary.LittleEndian.Uint32(b[12:])}
	if m.rank >= n || !validNum(m.qpn) || m.psn >= 1<<24 || (m.kind != msgRequest && m.psn != 0) {
		return message{}, fmt.Errorf("%w: connection message (kind %d) from rank %d, QPN %#x, PSN %#x", errRecord, m.kind, m.rank, m.qpn, m.psn)
	}
	return m, nil
}
