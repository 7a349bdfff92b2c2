package rc

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
//	24  n × (QPN u32, PSN u32): the QP this rank made for each rank, and
//	    its first send PSN; QPN 0 when there is none (a rank of the same
//	    node, this rank itself, or lazy connection)
const recordHdr = verbsx.RecordHeader

// record is a decoded record.
type record struct {
	mtu  verbs.MTU
	gid  verbs.GID
	qpns []uint32
	psns []uint32
}

// errRecord reports a record that does not decode.
var errRecord = errors.New("rc: malformed record")

func (r *record) encode() []byte {
	b := verbsx.NewRecord(r.mtu, r.gid, len(r.qpns), recordHdr, recordHdr+8*len(r.qpns))
	for i := range r.qpns {
		b = binary.LittleEndian.AppendUint32(b, r.qpns[i])
		b = binary.LittleEndian.AppendUint32(b, r.psns[i])
	}
	return b
}

// parseRecord decodes b, which must describe n ranks.
func parseRecord(b []byte, n int) (*record, error) {
	r := &record{}
	var err error
	if r.mtu, r.gid, err = verbsx.ParseRecordHeader(b, n, recordHdr, errRecord); err != nil {
		return nil, err
	}
	if len(b) != recordHdr+8*n {
		return nil, fmt.Errorf("%w: %d bytes for %d ranks", errRecord, len(b), n)
	}
	r.qpns, r.psns = make([]uint32, n), make([]uint32, n)
	for i := range n {
		r.qpns[i] = binary.LittleEndian.Uint32(b[recordHdr+8*i:])
		r.psns[i] = binary.LittleEndian.Uint32(b[recordHdr+8*i+4:])
		if r.qpns[i] >= 1<<24 || r.psns[i] >= 1<<24 {
			return nil, fmt.Errorf("%w: QPN %#x, PSN %#x for rank %d", errRecord, r.qpns[i], r.psns[i], i)
		}
	}
	return r, nil
}

// A lazy connection message, put in the peer's mailbox (see lazy.go): a
// hello, a ready once the sender's QP is up, or a refusal if it could not
// be brought up.
//
//	0   version (u8) = 1
//	1   kind (u8): 0 hello, 1 ready, 2 refusal; 2 reserved bytes
//	4   the sender's rank (u32)
//	8   hello, ready: the sender's QPN for the receiver (u32); refusal: the
//	    receiver's QPN of the hello refused
//	12  hello: its first send PSN (u32); otherwise 0
const (
	helloVersion = 1
	helloLen     = 16
	kindHello    = 0
	kindReady    = 1
	kindRefusal  = 2
)

type hello struct {
	kind     uint8
	rank     int
	qpn, psn uint32
}

func (h hello) encode() []byte {
	b := make([]byte, helloLen)
	b[0], b[1] = helloVersion, h.kind
	binary.LittleEndian.PutUint32(b[4:], uint32(h.rank))
	binary.LittleEndian.PutUint32(b[8:], h.qpn)
	binary.LittleEndian.PutUint32(b[12:], h.psn)
	return b
}

func parseHello(b []byte, n int) (hello, error) {
	if len(b) != helloLen || b[0] != helloVersion || b[1] > kindRefusal || b[2]|b[3] != 0 {
		return hello{}, fmt.Errorf("%w: connection request of %d bytes", errRecord, len(b))
	}
	h := hello{kind: b[1], rank: int(binary.LittleEndian.Uint32(b[4:])), qpn: binary.LittleEndian.Uint32(b[8:]),
		psn: binary.LittleEndian.Uint32(b[12:])}
	if h.rank >= n || h.qpn == 0 || h.qpn >= 1<<24 || h.psn >= 1<<24 || h.kind != kindHello && h.psn != 0 {
		return hello{}, fmt.Errorf("%w: connection request from rank %d, QPN %#x, PSN %#x", errRecord, h.rank, h.qpn, h.psn)
	}
	return h, nil
}
