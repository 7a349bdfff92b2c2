package softhca_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/softhca/hcatest"
	"github.com/xrcrun/xrc/verbs"
)

// Roles of the test binary (TestMain) for TestClientHandsOff.
const (
	envHandOff = "XRC_TEST_HAND_OFF" // device name: attach, hand the connection to a holder, exit
	envHolder  = "XRC_TEST_HOLDER"   // hold the descriptors passed, print "holding", wait to be killed
)

// handOffForTest attaches to a device, makes a PD, starts a holder process
// with its sockets (the device connection among them), prints the
// holder's PID and exits, as a process that forks and exits does.
func handOffForTest(name string) int {
	c, err := verbs.Open(context.Background(), name, verbs.Config{})
	if err == nil {
		_, err = c.AllocPD()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	holder := exec.Command(os.Args[0], "-test.run=^$")
	holder.Env = append(os.Environ(), envHandOff+"=", envHolder+"=1")
	holder.Stderr = os.Stderr
	for _, e := range fds {
		link, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if fd, err := strconv.Atoi(e.Name()); err == nil && strings.HasPrefix(link, "socket:") {
			holder.ExtraFiles = append(holder.ExtraFiles, os.NewFile(uintptr(fd), link))
		}
	}
	out, err := holder.StdoutPipe()
	if err == nil {
		err = holder.Start()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "holding\n" {
		fmt.Fprintln(os.Stderr, "holder:", line, err)
		return 1
	}
	fmt.Printf("%d\n", holder.Process.Pid)
	return 0
}

func holderForTest() int {
	fmt.Println("holding")
	select {} // until killed
}

// TestClientHandsOff: a client process that hands its device connection
// to another process and exits is gone for the device, which destroys its
// objects. The device moves a session's data by the PID that connected;
// keeping the session for the new holder would give it to whatever
// process gets that PID next.
func TestClientHandsOff(t *testing.T) {
	dir := t.TempDir()
	s := hcatest.Start(t, dir)
	before := s.Counters(t)
	cmd, out := startClient(t, envHandOff+"="+s.Name, softhca.RuntimeDirEnv+"="+dir)
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("client: %q, %v", line, err)
	}
	holder, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("client: %q", line)
	}
	t.Cleanup(func() { syscall.Kill(holder, syscall.SIGKILL) })
	if err := cmd.Wait(); err != nil {
		t.Fatalf("client: %v", err)
	}
	if err := syscall.Kill(holder, 0); err != nil {
		t.Fatalf("the holder is gone: %v", err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		after := s.Counters(t)
		if after["objects_clients"] == before["objects_clients"] && after["objects_pds"] == before["objects_pds"] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the client exited, with its connection held: %v clients and %v PDs; before it: %v and %v",
				after["objects_clients"], after["objects_pds"], before["objects_clients"], before["objects_pds"])
		}
	}
}
