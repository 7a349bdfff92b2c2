package shm

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// TestKickAfterClose: a Kick that comes after Close (another goroutine's
// wake-up racing the end) does nothing; it wrote to the unmapped header
// and the process died with SIGSEGV. Run in a child process, so that a
// regression fails this test rather than the whole run.
func TestKickAfterClose(t *testing.T) {
	if os.Getenv("XRC_SHM_KICK_CHILD") == "1" {
		in, err := CreateInbox(t.TempDir()+"/in", 1, 4096)
		if err != nil {
			t.Fatal(err)
		}
		if err := in.Close(); err != nil {
			t.Fatal(err)
		}
		if err := in.Kick(); err != nil {
			t.Fatal(err)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKickAfterClose$")
	cmd.Env = append(os.Environ(), "XRC_SHM_KICK_CHILD=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("Kick after Close: %v\n%s", err, bytes.TrimSpace(out[:min(len(out), 300)]))
	}
}
