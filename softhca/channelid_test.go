//go:build linux

package softhca

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
)

// TestRemoteChannelIDs creates two completion channels for a client in
// another process, with a descriptor of the device closed in between, as
// another client's connection or a passed memfd is. The device closes its
// copy of each channel's client end once it is passed, so that descriptor
// number is soon free in the device; the second channel must still get an
// id of its own, and the first must stay the client's: its CQs' events
// must not go to the second, nor its file end.
func TestRemoteChannelIDs(t *testing.T) {
	w := newSvcWorld(t)
	defer w.close()
	sess := w.session(t)
	defer sess.close()
	var held []int // the client's ends, as the client process would hold them
	defer func() {
		for _, fd := range held {
			unix.Close(fd)
		}
	}()
	call := func(msg []byte) []int32 {
		t.Helper()
		a := sess.request(msg, nil, 0, nil)
		for _, fd := range a.pass {
			if fd == sess.kick {
				continue
			}
			dup, err := unix.Dup(fd)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, dup)
		}
		for _, fd := range a.close { // what run does once the reply is sent
			unix.Close(fd)
		}
		body, err := parseReply(a.reply, msgType(binary.LittleEndian.Uint32(msg)))
		if err != nil {
			t.Fatalf("request %x: %v", msg, err)
		}
		if binary.LittleEndian.Uint32(msg) != uint32(msgCommand) {
			return nil
		}
		ids, err := parseIDs(body)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	command := func(b []byte) []int32 {
		binary.NativeEndian.PutUint64(b[8:], w.rw)
		return call(append(appendRequest(nil, msgCommand), b...))
	}
	call(w.goodHello())
	command(frame(uverbs.CmdGetContext, &uverbs.Cmd[uverbs.GetContext]{}, 32))

	hole, err := unix.Eventfd() // a descriptor of the device that goes away
	if err != nil {
		t.Fatal(err)
	}
	first := command(frame(uverbs.CmdCreateCompChannel, &uverbs.Cmd[uverbs.CreateCompChannel]{}, 4))
	unix.Close(hole)
	second := command(frame(uverbs.CmdCreateCompChannel, &uverbs.Cmd[uverbs.CreateCompChannel]{}, 4))
	if len(first) != 1 || len(second) != 1 {
		t.Fatalf("channels passed with ids %v and %v", first, second)
	}
	if first[0] == second[0] {
		t.Errorf("both completion channels have id %d", first[0])
	}
	w.d.mu.Lock()
	n := len(sess.c.channels)
	w.d.mu.Unlock()
	if n != 2 {
		t.Errorf("the client has %d completion channels, want 2", n)
	}

	// A channel whose end the client closed leaves the device's table at
	// the next creation, as numbers that are never reused do not make it.
	unix.Close(held[len(held)-2])
	held = slices.Delete(held, len(held)-2, len(held)-1)
	command(frame(uverbs.CmdCreateCompChannel, &uverbs.Cmd[uverbs.CreateCompChannel]{}, 4))
	w.d.mu.Lock()
	n = len(sess.c.channels)
	w.d.mu.Unlock()
	if n != 2 {
		t.Errorf("the client has %d completion channels after closing one of 3, want 2", n)
	}
}
