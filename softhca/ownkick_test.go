//go:build linux

package softhca

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
)

// eventfdID is the kernel's id of the eventfd that descriptor fd refers
// to (/proc/self/fdinfo, Linux 6.0 and later), or "" if it does not say.
func eventfdID(t *testing.T, fd int) string {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "eventfd-id:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestClientsOwnKick: each client gets an eventfd of its own to wake the
// device with. A client that holds the device's eventfd can read it as
// well as signal it: sharing one, a client that reads it takes the
// wake-ups of the others, whose doorbells then wait in their rings for as
// long as the engine sleeps (a client signals once per sleep).
func TestClientsOwnKick(t *testing.T) {
	dir, _ := serveForTest(t, "ownkick", "127.7.4.4")
	var ids []string
	for range 2 {
		k, err := Attach(context.Background(), dir, "ownkick")
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		id := eventfdID(t, k.(*remoteKernel).bells.kick)
		if id == "" {
			t.Skip("the kernel does not show eventfd ids")
		}
		ids = append(ids, id)
	}
	if ids[0] == ids[1] {
		t.Errorf("both clients were given eventfd %s", ids[0])
	}
}
