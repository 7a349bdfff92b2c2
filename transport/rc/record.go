package rc

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/xrcrun/xrc/verbs"
)

// A record is what a rank publishes for the others before Connect:
//
//	0   version (u8) = 1
//	1   path MTU of the port (u8, verbs.MTU)
//	2   reserved (u16)
//	4   number of ranks n (u32)
//	8   the port's GID (16 bytes)
//	24  n × (QPN u32, PSN u32): the QP this rank made for each rank, and
//	    its first send PSN; QPN 0 when there is none (a rank of the same
//	    node, this rank itself, or lazy connection)
const (
	recordVersion = 1
	recordHdr     = 24
	maxRanks      = 1 << 20
)

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
	b := make([]byte, recordHdr, recordHdr+8*len(r.qpns))
	b[0], b[1] = recordVersion, byte(r.mtu)
	binary.LittleEndian.PutUint32(b[4:], uint32(len(r.qpns)))
	copy(b[8:], r.gid[:])
	for i := range r.qpns {
		b = binary.LittleEndian.AppendUint32(b, r.qpns[i])
		b = binary.LittleEndian.AppendUint32(b, r.psns[i])
	}
	return b
}

// parseRecord decodes b, which must describe n ranks.
func parseRecord(b []byte, n int) (*record, error) {
	if len(b) < recordHdr {
		return nil, fmt.Errorf("%w: %d bytes", errRecord, len(b))
	}
	if b[0] != recordVersion {
		return nil, fmt.Errorf("%w: version %d", errRecord, b[0])
	}
	r := &record{mtu: verbs.MTU(b[1])}
	if r.mtu.Bytes() == 0 {
		return nil, fmt.Errorf("%w: MTU %d", errRecord, b[1])
	}
	if got := binary.LittleEndian.Uint32(b[4:]); got != uint32(n) || n > maxRanks {
		return nil, fmt.Errorf("%w: %d ranks, the job has %d", errRecord, got, n)
	}
	if len(b) != recordHdr+8*n {
		return nil, fmt.Errorf("%w: %d bytes for %d ranks", errRecord, len(b), n)
	}
	copy(r.gid[:], b[8:24])
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

// A lazy connection request, put in the peer's mailbox (see lazy.go):
//
//	0   version (u8) = 1, 3 reserved bytes
//	4   the sender's rank (u32)
//	8   the sender's QPN for the receiver (u32)
//	12  its first send PSN (u32)
const helloLen = 16

type hello struct {
	rank     int
	qpn, psn uint32
}

func (h hello) encode() []byte {
	b := make([]byte, helloLen)
	b[0] = recordVersion
	binary.LittleEndian.PutUint32(b[4:], uint32(h.rank))
	binary.LittleEndian.PutUint32(b[8:], h.qpn)
	binary.LittleEndian.PutUint32(b[12:], h.psn)
	return b
}

func parseHello(b []byte, n int) (hello, error) {
	if len(b) != helloLen || b[0] != recordVersion {
		return hello{}, fmt.Errorf("%w: connection request of %d bytes", errRecord, len(b))
	}
	h := hello{rank: int(binary.LittleEndian.Uint32(b[4:])), qpn: binary.LittleEndian.Uint32(b[8:]),
		psn: binary.LittleEndian.Uint32(b[12:])}
	if h.rank >= n || h.qpn == 0 || h.qpn >= 1<<24 || h.psn >= 1<<24 {
		return hello{}, fmt.Errorf("%w: connection request from rank %d, QPN %#x, PSN %#x", errRecord, h.rank, h.qpn, h.psn)
	}
	return h, nil
}
