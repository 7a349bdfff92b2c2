package transporttest

import "encoding/binary"

// Pattern is n bytes that depend on seed.
func Pattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seed*131 + i*7 + i>>8)
	}
	return b
}

// FrameSize is the size of frame i of a test stream whose frames are at
// most largest bytes: 8 (inline), 0, largest, and sizes between.
func FrameSize(i, largest int) int {
	switch i % 5 {
	case 0:
		return 8 // inline
	case 1:
		return 0
	case 2:
		return largest
	}
	return 8 + i*37%(largest-8)
}

// Frame is frame i of the test stream seed: Pattern(seed+i) of
// FrameSize(i, largest) bytes, beginning with i when it has room, in two
// parts.
func Frame(seed, i, largest int) [][]byte {
	b := Pattern(seed+i, FrameSize(i, largest))
	if len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, uint64(i))
	}
	return [][]byte{b[:len(b)/2], b[len(b)/2:]}
}
