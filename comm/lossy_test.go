package comm

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc64"
	"math/rand/v2"
	"testing"

	"github.com/xrcrun/xrc/softhca"
)

// TestLossyRC: two nodes of two ranks whose soft HCAs speak RoCEv2 on
// UDP and lose 5% of the packets they send. Every rank sends every rank
// of the other node messages of random sizes, eager and rendezvous, each
// with its checksum; all arrive intact and in order.
func TestLossyRC(t *testing.T) { testLossy(t, "rc") }

// TestLossyXRC is TestLossyRC over XRC.
func TestLossyXRC(t *testing.T) { testLossy(t, "xrc") }

func testLossy(t *testing.T, tr string) {
	l := layout{nodeOf: func(r int) int { return r % 2 }, udp: true, faults: softhca.Faults{Loss: 0.05, Seed: 11}, transport: tr}
	comms, devs := worldDevs(t, 4, l)
	const per = 60
	table := crc64.MakeTable(crc64.ECMA)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		rng := rand.New(rand.NewPCG(uint64(c.Rank()), 7))
		var reqs []*Request
		var bufs [][]byte
		var froms []int
		for src := range c.Size() {
			if src%2 == c.Rank()%2 {
				continue
			}
			for range per {
				b := make([]byte, 300<<10)
				r, err := c.Irecv(b, src, 1)
				if err != nil {
					return err
				}
				reqs, bufs, froms = append(reqs, r), append(bufs, b), append(froms, src)
			}
		}
		for dst := range c.Size() {
			if dst%2 == c.Rank()%2 {
				continue
			}
			for i := range per {
				n := 16 + rng.IntN(300<<10-16)
				if i%3 == 0 {
					n = 16 + rng.IntN(2000) // eager
				}
				b := make([]byte, n)
				for j := 16; j+8 <= n; j += 8 {
					binary.LittleEndian.PutUint64(b[j:], rng.Uint64())
				}
				binary.LittleEndian.PutUint32(b, uint32(i))
				binary.LittleEndian.PutUint64(b[8:], crc64.Checksum(b[16:], table))
				r, err := c.Isend(b, dst, 1)
				if err != nil {
					return err
				}
				reqs = append(reqs, r)
			}
		}
		sts, err := Waitall(ctx, reqs...)
		if err != nil {
			return err
		}
		next := map[int]int{}
		for i, b := range bufs {
			st := sts[i]
			m := b[:st.Count]
			if st.Source != froms[i] || len(m) < 16 {
				return fmt.Errorf("receive %d: %+v", i, st)
			}
			if seq := int(binary.LittleEndian.Uint32(m)); seq != next[st.Source] {
				return fmt.Errorf("from %d: message %d, want %d", st.Source, seq, next[st.Source])
			}
			next[st.Source]++
			if binary.LittleEndian.Uint64(m[8:]) != crc64.Checksum(m[16:], table) {
				return fmt.Errorf("from %d: message %d of %d bytes: bad checksum", st.Source, next[st.Source]-1, len(m))
			}
		}
		return nil
	})
	for node, d := range devs {
		c := d.Counters()
		t.Logf("node %d: %d packets sent, %d dropped, %d retransmitted, %d RNR NAKs sent", node,
			c.XmitPackets.Load(), c.FaultDrops.Load(), c.Retransmits.Load(), c.RNRNaksSent.Load())
		if c.FaultDrops.Load() == 0 || c.Retransmits.Load() == 0 {
			t.Errorf("node %d: no packet lost or retransmitted", node)
		}
	}
}
