package main

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestZombie: a running process is not taken for one that has exited; a
// process that has exited and is not reaped yet is, and so is one reaped.
func TestZombie(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if zombie(pid) {
		t.Error("a running sleep is taken for a zombie")
	}
	syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(time.Minute)
	for !zombie(pid) {
		if time.Now().After(deadline) {
			t.Fatal("a killed, unreaped sleep is not taken for a zombie")
		}
		time.Sleep(time.Millisecond)
	}
	cmd.Wait()
	if !zombie(pid) {
		t.Error("a reaped process is taken for a running one")
	}
}
