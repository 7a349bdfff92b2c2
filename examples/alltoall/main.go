// Command alltoall has every rank send a checksummed message to every
// other rank and verify everything it receives, for each message size
// from -min to -max (doubling), -n times. With -report it then prints, per
// node, the connections the job made (QPs by type, SRQs, queue memory,
// connect time) next to what RC and XRC need by formula; -json prints the
// same as one JSON array.
//
//	xrcrun -n 16 --nodes 4 --transport xrc ./examples/alltoall -max 4194304 -report
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/crc64"
	"math/rand/v2"
	"os"
	"time"

	"github.com/xrcrun/xrc/comm"
)

var table = crc64.MakeTable(crc64.ECMA)

func main() {
	minSize := flag.Int("min", 0, "smallest message, bytes")
	maxSize := flag.Int("max", 1<<20, "largest message, bytes")
	iters := flag.Int("n", 1, "rounds per size")
	report := flag.Bool("report", false, "print the connection report per node")
	asJSON := flag.Bool("json", false, "print the connection report as JSON")
	flag.Parse()
	if *minSize < 0 || *maxSize < *minSize || *iters < 1 || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "alltoall: want 0 <= -min <= -max and -n >= 1, and no arguments")
		os.Exit(2)
	}
	if err := run(context.Background(), *minSize, *maxSize, *iters, *report, *asJSON); err != nil {
		fmt.Fprintln(os.Stderr, "alltoall:", err)
		os.Exit(1)
	}
}

// message is the content rank src sends to dst in a round: random bytes
// from a seed both sides know. The receiver compares the CRC-64 of what
// arrived with that of the message it expected, so it checks that it got
// the right message, not only an intact one.
func message(src, dst, size, round int) []byte {
	b := make([]byte, size)
	rng := rand.New(rand.NewPCG(uint64(src)<<32|uint64(dst), uint64(size)<<16|uint64(round)))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func run(ctx context.Context, minSize, maxSize, iters int, report, asJSON bool) error {
	w, err := comm.Init(ctx, comm.Config{})
	if err != nil {
		return err
	}
	rank, n := w.Rank(), w.Size()
	start := time.Now()
	var bytes int64
	for size := minSize; size <= maxSize; size = max(2*size, 1) {
		for round := range iters {
			var reqs []*comm.Request
			in := make([][]byte, n)
			for src := range n {
				if src == rank {
					continue
				}
				in[src] = make([]byte, size)
				r, err := w.Irecv(in[src], src, round)
				if err != nil {
					return err
				}
				reqs = append(reqs, r)
			}
			for dst := range n {
				if dst == rank {
					continue
				}
				r, err := w.Isend(message(rank, dst, size, round), dst, round)
				if err != nil {
					return err
				}
				reqs = append(reqs, r)
			}
			if _, err := comm.Waitall(ctx, reqs...); err != nil {
				return fmt.Errorf("size %d, round %d: %w", size, round, err)
			}
			var errs []error
			for src := range n {
				if src == rank {
					continue
				}
				want := message(src, rank, size, round)
				if crc64.Checksum(in[src], table) != crc64.Checksum(want, table) {
					errs = append(errs, fmt.Errorf("size %d, round %d: the message from rank %d is wrong", size, round, src))
				}
			}
			if err := errors.Join(errs...); err != nil {
				return err
			}
			bytes += int64(size) * int64(n-1)
		}
		if size == maxSize {
			break
		}
	}
	if rank == 0 {
		fmt.Printf("alltoall: %d ranks, sizes %d..%d bytes, %d rounds each: every checksum right (%.1f MB received per rank in %v)\n",
			n, minSize, maxSize, iters, float64(bytes)/1e6, time.Since(start).Round(time.Millisecond))
	}
	if report || asJSON {
		if err := w.WriteReport(ctx, os.Stdout, asJSON); err != nil {
			return err
		}
	}
	return w.Finalize(ctx)
}
