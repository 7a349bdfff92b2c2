package verbsx

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/xrcrun/xrc/bootstrap/boottest"
)

// TestMailboxEqualMessages: two equal messages to one mailbox are read as
// two (the bootstrap server takes a Put of the value a key holds as done,
// so they used to land in one slot), and a value too short to carry its
// tag reaches the reader as nil, which it refuses.
func TestMailboxEqualMessages(t *testing.T) {
	cs := boottest.Clients(t, []int{0, 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m0, m1 := NewMailbox(cs[0], "t"), NewMailbox(cs[1], "t")
	for range 2 {
		if err := m0.Put(ctx, 1, []byte("same")); err != nil {
			t.Fatal(err)
		}
	}
	if err := cs[0].Put(ctx, m0.key(1, 2), []byte("short")); err != nil {
		t.Fatal(err)
	}
	var got [][]byte
	rctx, rcancel := context.WithCancel(ctx)
	m1.Read(rctx, 1, func(slot int, v []byte) {
		got = append(got, v)
		if len(got) == 3 {
			rcancel()
		}
	})
	if len(got) != 3 || !bytes.Equal(got[0], []byte("same")) || !bytes.Equal(got[1], []byte("same")) || got[2] != nil {
		t.Fatalf("read %q", got)
	}
}
