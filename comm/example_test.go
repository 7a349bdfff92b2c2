package comm_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/xrcrun/xrc/bootstrap"
	"github.com/xrcrun/xrc/comm"
)

// inProcess runs a job of n ranks as goroutines of this process, all on
// one node (so they talk through shared memory and need no device): it
// serves the rendezvous as xrcrun would, joins each rank, calls f with
// each rank's world communicator at once, and finalizes them. A program
// started by xrcrun calls comm.Init(ctx, comm.Config{}) instead, once per
// process (see ExampleInit).
func inProcess(n int, f func(ctx context.Context, w *comm.Comm) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := make([]byte, 32)
	rand.Read(key)
	srv, err := bootstrap.Listen(ctx, "127.0.0.1:0", bootstrap.ServerConfig{Size: n, Key: key})
	if err != nil {
		return err
	}
	defer srv.Close()
	go srv.Serve(ctx)
	dir, err := os.MkdirTemp("", "comm-example")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			env := bootstrap.Env{Rank: r, Size: n, LocalRank: r, LocalSize: n, Nodes: 1,
				Addr: srv.Addr(), Key: key, JobID: "example"}
			b, err := bootstrap.Join(ctx, env.Addr, key, bootstrap.Member{Rank: r, LocalRank: r}, n, bootstrap.ClientConfig{})
			if err != nil {
				errs[r] = err
				return
			}
			w, err := comm.Init(ctx, comm.Config{Bootstrap: b, Env: &env, Dir: dir})
			if err != nil {
				errs[r] = err
				return
			}
			errs[r] = errors.Join(f(ctx, w), w.Finalize(ctx))
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// A program started by xrcrun joins its job with Init, which reads what
// the launcher put in the environment, and leaves it with Finalize.
// Run without a launcher, it is rank 0 of a world of one.
func ExampleInit() {
	ctx := context.Background()
	w, err := comm.Init(ctx, comm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("rank %d of %d\n", w.Rank(), w.Size())
	if err := w.Barrier(ctx); err != nil {
		log.Fatal(err)
	}
	if err := w.Finalize(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: rank 0 of 1
}

// Rank 0 sends to rank 1, which receives from any source with any tag
// and learns from the status who sent what. Send returns once its buffer
// may be reused; Recv once the message is in buf.
func ExampleComm_Send() {
	err := inProcess(2, func(ctx context.Context, w *comm.Comm) error {
		switch w.Rank() {
		case 0:
			return w.Send(ctx, []byte("hello"), 1, 7)
		case 1:
			buf := make([]byte, 64)
			st, err := w.Recv(ctx, buf, comm.AnySource, comm.AnyTag)
			if err != nil {
				return err
			}
			fmt.Printf("rank 1 got %q from rank %d, tag %d\n", buf[:st.Count], st.Source, st.Tag)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: rank 1 got "hello" from rank 0, tag 7
}

// A receive whose buffer is too short gets the message's first bytes and
// an error that errors.Is matches with ErrTruncate.
func ExampleComm_Recv_truncate() {
	err := inProcess(2, func(ctx context.Context, w *comm.Comm) error {
		if w.Rank() == 0 {
			return w.Send(ctx, []byte("a long message"), 1, 0)
		}
		buf := make([]byte, 6)
		st, err := w.Recv(ctx, buf, 0, 0)
		fmt.Printf("%q, %v\n", buf[:st.Count], errors.Is(err, comm.ErrTruncate))
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: "a long", true
}

// If the context of a Recv ends before a message matches, the receive is
// taken back and Recv returns the context's error: buf is the caller's
// again, and a message that comes later goes to a later receive.
func ExampleComm_Recv_timeout() {
	err := inProcess(1, func(ctx context.Context, w *comm.Comm) error {
		tctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		_, err := w.Recv(tctx, make([]byte, 8), comm.AnySource, 99) // nobody sends
		fmt.Println(errors.Is(err, context.DeadlineExceeded))
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: true
}

// Every rank posts its receive from its left neighbour before it sends to
// its right one, so that no rank waits for another to receive first
// (a ring of blocking Sends of large messages would deadlock). The
// buffers belong to the requests until Waitall returns.
func ExampleComm_Irecv() {
	const n = 3
	err := inProcess(n, func(ctx context.Context, w *comm.Comm) error {
		right, left := (w.Rank()+1)%n, (w.Rank()+n-1)%n
		in := make([]byte, 1)
		rr, err := w.Irecv(in, left, 0)
		if err != nil {
			return err
		}
		sr, err := w.Isend([]byte{byte(w.Rank())}, right, 0)
		if err != nil {
			return err
		}
		if _, err := comm.Waitall(ctx, rr, sr); err != nil {
			return err
		}
		// Gather the results at rank 0 to print them in rank order.
		all := make([]byte, n)
		if err := w.Gather(ctx, in, all, 0); err != nil {
			return err
		}
		if w.Rank() == 0 {
			for r, from := range all {
				fmt.Printf("rank %d got %d\n", r, from)
			}
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// rank 0 got 2
	// rank 1 got 0
	// rank 2 got 1
}

// Allreduce sums a vector over all the ranks; every rank gets the result.
func ExampleAllreduce() {
	err := inProcess(4, func(ctx context.Context, w *comm.Comm) error {
		send := []int64{int64(w.Rank()), 1}
		recv := make([]int64, 2)
		if err := comm.Allreduce(ctx, w, send, recv, comm.Sum[int64]); err != nil {
			return err
		}
		if w.Rank() == 0 {
			fmt.Printf("sum of ranks %d, ranks %d\n", recv[0], recv[1])
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: sum of ranks 6, ranks 4
}

// Bcast copies root's buffer to every rank. Vectors of numbers go as
// their bytes (Bytes).
func ExampleComm_Bcast() {
	err := inProcess(3, func(ctx context.Context, w *comm.Comm) error {
		v := make([]float64, 3)
		if w.Rank() == 2 {
			v = []float64{0.5, 1.5, 2.5}
		}
		if err := w.Bcast(ctx, comm.Bytes(v), 2); err != nil {
			return err
		}
		all := make([]float64, 3*len(v))
		if err := w.Gather(ctx, comm.Bytes(v), comm.Bytes(all), 0); err != nil {
			return err
		}
		if w.Rank() == 0 {
			fmt.Println(all)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: [0.5 1.5 2.5 0.5 1.5 2.5 0.5 1.5 2.5]
}

// A non-blocking collective runs while the rank computes; its buffers
// belong to the request until Wait returns. The context passed to
// Iallreduce bounds the collective itself, so it must outlive the
// request; the context of Wait bounds only the wait.
func ExampleIallreduce() {
	err := inProcess(2, func(ctx context.Context, w *comm.Comm) error {
		send := []float64{float64(w.Rank() + 1)}
		recv := make([]float64, 1)
		req := comm.Iallreduce(ctx, w, send, recv, comm.Max[float64])
		// ... work that touches neither send nor recv ...
		if _, err := req.Wait(ctx); err != nil {
			return err
		}
		if w.Rank() == 0 {
			fmt.Println("max:", recv[0])
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: max: 2
}

// Split makes a communicator per color; its collectives involve only its
// ranks. Free releases it once the rank is done with it.
func ExampleComm_Split() {
	err := inProcess(4, func(ctx context.Context, w *comm.Comm) error {
		half, err := w.Split(ctx, w.Rank()%2, w.Rank())
		if err != nil {
			return err
		}
		sum := make([]int, 1)
		if err := comm.Allreduce(ctx, half, []int{w.Rank()}, sum, comm.Sum[int]); err != nil {
			return err
		}
		res := make([]int, 2*w.Size())
		if err := w.Gather(ctx, comm.Bytes([]int{half.Rank(), sum[0]}), comm.Bytes(res), 0); err != nil {
			return err
		}
		if w.Rank() == 0 {
			for r := range w.Size() {
				fmt.Printf("world rank %d: rank %d of its half, whose ranks sum to %d\n", r, res[2*r], res[2*r+1])
			}
		}
		return half.Free()
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// world rank 0: rank 0 of its half, whose ranks sum to 2
	// world rank 1: rank 0 of its half, whose ranks sum to 4
	// world rank 2: rank 1 of its half, whose ranks sum to 2
	// world rank 3: rank 1 of its half, whose ranks sum to 4
}

// Mprobe takes a message out of the matching, so that the goroutine that
// probed it, having sized its buffer, is the one to receive it.
func ExampleComm_Mprobe() {
	err := inProcess(2, func(ctx context.Context, w *comm.Comm) error {
		if w.Rank() == 0 {
			return w.Send(ctx, []byte("of unknown length"), 1, 3)
		}
		msg, err := w.Mprobe(ctx, comm.AnySource, 3)
		if err != nil {
			return err
		}
		buf := make([]byte, msg.Status().Count)
		if _, err := msg.Recv(ctx, buf); err != nil {
			return err
		}
		fmt.Printf("%d bytes: %q\n", len(buf), buf)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: 17 bytes: "of unknown length"
}
