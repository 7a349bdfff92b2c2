package comm

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// TestRecvContextEnds: a Recv whose context ends before a message comes
// returns the context's error and leaves nothing behind: the message sent
// later goes to the next Recv, and the first buffer is not written.
func TestRecvContextEnds(t *testing.T) {
	onLayouts(t, func(t *testing.T, l layout) {
		comms := worldOn(t, 2, l)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, size := range []int{5, 100000} { // eager, rendezvous
			first := make([]byte, size)
			short, stop := context.WithTimeout(ctx, 10*time.Millisecond)
			_, err := comms[1].Recv(short, first, 0, 7)
			stop()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%d bytes: Recv with no message: %v", size, err)
			}
			errc := make(chan error, 1)
			go func() { errc <- comms[0].Send(ctx, pattern(3, size), 1, 7) }()
			second := make([]byte, size)
			st, err := comms[1].Recv(ctx, second, 0, 7)
			if err != nil || st.Count != size || !bytes.Equal(second, pattern(3, size)) {
				t.Fatalf("%d bytes: the next Recv: %+v, %v", size, st, err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(first, make([]byte, size)) {
				t.Fatalf("%d bytes: the abandoned buffer was written", size)
			}
		}
	})
}

// TestCancel: Cancel takes back a receive no message has matched, and
// not one that has completed or a send.
func TestCancel(t *testing.T) {
	comms := world(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := comms[1].Irecv(make([]byte, 8), 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Cancel() {
		t.Fatal("Cancel of a posted receive: false")
	}
	if _, err := r.Wait(ctx); !errors.Is(err, ErrCanceled) {
		t.Fatalf("Wait after Cancel: %v", err)
	}
	if r.Cancel() {
		t.Fatal("a second Cancel: true")
	}
	s, err := comms[0].Isend([]byte("12345678"), 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	r, err = comms[1].Irecv(buf, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Waitall(ctx, s, r); err != nil {
		t.Fatal(err)
	}
	if s.Cancel() || r.Cancel() || string(buf) != "12345678" {
		t.Fatalf("Cancel of a completed send or receive: true, or %q received", buf)
	}
}
