package verbsx

import (
	"encoding/binary"
	"fmt"

	"github.com/xrcrun/xrc/verbs"
)

// The record of a verbs transport (what a rank publishes for the others
// before Connect) begins with the same header:
//
//	0   version (u8) = 1
//	1   path MTU of the port (u8, verbs.MTU)
//	2   reserved (u16)
//	4   number of ranks n (u32)
//	8   the port's GID (16 bytes)
//
// and goes on, from byte 24, with what is the transport's own.
const (
	RecordVersion = 1
	RecordHeader  = 24
	// MaxRanks bounds the ranks of a job.
	MaxRanks = 1 << 20
)

// NewRecord starts the record of a job of n ranks: the header of the
// port (mtu, gid), then zeros up to hdr bytes, in a buffer of capacity
// size.
func NewRecord(mtu verbs.MTU, gid verbs.GID, n, hdr, size int) []byte {
	b := make([]byte, hdr, size)
	b[0], b[1] = RecordVersion, byte(mtu)
	binary.LittleEndian.PutUint32(b[4:], uint32(n))
	copy(b[8:], gid[:])
	return b
}

// ParseRecordHeader decodes the header of b, the record of a rank of a
// job of n ranks, which is at least hdr bytes long. Its errors wrap bad.
func ParseRecordHeader(b []byte, n, hdr int, bad error) (verbs.MTU, verbs.GID, error) {
	if len(b) < hdr {
		return 0, verbs.GID{}, fmt.Errorf("%w: %d bytes", bad, len(b))
	}
	if b[0] != RecordVersion {
		return 0, verbs.GID{}, fmt.Errorf("%w: version %d", bad, b[0])
	}
	mtu := verbs.MTU(b[1])
	if mtu.Bytes() == 0 {
		return 0, verbs.GID{}, fmt.Errorf("%w: MTU %d", bad, b[1])
	}
	if got := binary.LittleEndian.Uint32(b[4:]); got != uint32(n) || n > MaxRanks {
		return 0, verbs.GID{}, fmt.Errorf("%w: %d ranks, the job has %d", bad, got, n)
	}
	var gid verbs.GID
	copy(gid[:], b[8:24])
	return mtu, gid, nil
}
