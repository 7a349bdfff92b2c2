// Command ring passes a token around the ranks of a job: rank 0 sends it
// to rank 1, each rank adds its number and passes it on, and rank 0
// checks the sum when it comes back, -n times.
//
//	xrcrun -n 8 ./examples/ring -n 100
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/xrcrun/xrc/comm"
)

func main() {
	laps := flag.Int("n", 10, "times around the ring")
	size := flag.Int("s", 8, "bytes in the token (at least 8)")
	report := flag.Bool("report", false, "print the connection report per node")
	asJSON := flag.Bool("json", false, "print the connection report as JSON")
	flag.Parse()
	if *laps < 1 || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "ring: -n must be positive, and there are no arguments")
		os.Exit(2)
	}
	if err := run(context.Background(), *laps, max(*size, 8), *report, *asJSON); err != nil {
		fmt.Fprintln(os.Stderr, "ring:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, laps, size int, report, asJSON bool) error {
	w, err := comm.Init(ctx, comm.Config{})
	if err != nil {
		return err
	}
	rank, n := w.Rank(), w.Size()
	next, prev := (rank+1)%n, (rank+n-1)%n
	tok := make([]byte, size)
	zero := make([]byte, size) // the token rank 0 starts
	start := time.Now()
	for lap := range laps {
		if rank == 0 {
			// Rank 0 posts the token's return before it sends: with one
			// rank it sends to itself, and a large Send waits for its
			// receive.
			r, err := w.Irecv(tok, prev, lap)
			if err != nil {
				return err
			}
			if err := w.Send(ctx, zero, next, lap); err != nil {
				return err
			}
			if _, err := r.Wait(ctx); err != nil {
				return err
			}
			if sum, want := binary.LittleEndian.Uint64(tok), uint64(n*(n-1)/2); sum != want {
				return fmt.Errorf("lap %d: the token came back with %d, want %d", lap, sum, want)
			}
			continue
		}
		if _, err := w.Recv(ctx, tok, prev, lap); err != nil {
			return err
		}
		sum := binary.LittleEndian.Uint64(tok)
		binary.LittleEndian.PutUint64(tok, sum+uint64(rank))
		if err := w.Send(ctx, tok, next, lap); err != nil {
			return err
		}
	}
	if rank == 0 {
		d := time.Since(start)
		fmt.Printf("%d laps of %d ranks with %d bytes in %v: %.2f usec per hop\n",
			laps, n, size, d.Round(time.Microsecond), float64(d.Microseconds())/float64(laps*n))
	}
	if report || asJSON {
		if err := w.WriteReport(ctx, os.Stdout, asJSON); err != nil {
			return err
		}
	}
	return w.Finalize(ctx)
}
