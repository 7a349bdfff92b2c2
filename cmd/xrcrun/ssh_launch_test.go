package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const sshdPath = "/usr/sbin/sshd"

// ensureSSHD installs Debian's openssh-server if sshd is missing, and skips
// the test, loudly, if that cannot be done.
func ensureSSHD(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(sshdPath); err == nil {
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: sshd is not installed and the test is not root to install openssh-server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "openssh-server", "openssh-client"}} {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Skipf("SKIPPED: sshd is not installed and apt-get %s failed: %v\n%s", args[0], err, out)
		}
	}
	if _, err := os.Stat(sshdPath); err != nil {
		t.Skipf("SKIPPED: openssh-server installed, yet no %s", sshdPath)
	}
}

// startSSHD runs sshd on a free port of 127.0.0.1 and 127.0.0.2, with a
// host key and an authorized user key made for the test, and returns the
// ssh command that logs in there.
func startSSHD(t *testing.T) string {
	t.Helper()
	ensureSSHD(t)
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Skip("SKIPPED: no ssh client")
	}
	dir, err := os.MkdirTemp("", "xrcrun-sshd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, k := range []string{"host_key", "user_key"} {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(dir, k)).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v\n%s", err, out)
		}
	}
	pub, err := os.ReadFile(filepath.Join(dir, "user_key.pub"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), pub, 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	config := fmt.Sprintf(`Port %d
ListenAddress 127.0.0.1
ListenAddress 127.0.0.2
HostKey %s/host_key
AuthorizedKeysFile %s/authorized_keys
PidFile %s/sshd.pid
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
`, port, dir, dir, dir)
	if err := os.WriteFile(filepath.Join(dir, "sshd_config"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		os.MkdirAll("/run/sshd", 0o755) // the privilege separation directory
	}
	var logs bytes.Buffer
	cmd := exec.Command(sshdPath, "-D", "-e", "-f", filepath.Join(dir, "sshd_config"))
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("sshd:\n%s", logs.String())
		}
	})
	for _, host := range []string{"127.0.0.1", "127.0.0.2"} {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			c, err := net.Dial("tcp", net.JoinHostPort(host, fmt.Sprint(port)))
			if err == nil {
				c.Close()
				break
			}
			select {
			case err := <-exited:
				t.Fatalf("sshd exited: %v\n%s", err, logs.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("sshd does not listen on %s:%d\n%s", host, port, logs.String())
			}
		}
	}
	return fmt.Sprintf("ssh -p %d -i %s/user_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR", port, dir)
}

// TestLaunchSSH runs a job on two "hosts", 127.0.0.1 and 127.0.0.2, through
// a real sshd: one agent per host started by ssh, each with a soft HCA on
// its host's address.
func TestLaunchSSH(t *testing.T) {
	_, rank := tools(t)
	ssh := startSSHD(t)
	// 127.0.0.1:4791 is taken (here, unless another job holds it): that
	// host's soft HCA moves to a free loopback address.
	if c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4791}); err == nil {
		defer c.Close()
	}
	j := startJob(t, ".", []string{"XRCRUN_TEST_X=by-ssh"}, "-H", "127.0.0.1,127.0.0.2", "-n", "4", "--ssh", ssh,
		"-x", "XRCRUN_TEST_X", rank)
	if st := j.wait(2 * time.Minute); st != 0 {
		t.Fatalf("exit status %d\n%s", st, j.stderr.String())
	}
	seen := checkRanks(t, strings.Split(strings.TrimSpace(j.out()), "\n"), 4, func(r int) int { return r / 2 })
	for r, ri := range seen {
		if ri.x != "by-ssh" || ri.nodes != 2 {
			t.Errorf("rank %d: %+v", r, ri)
		}
	}

	// A failure on a remote host ends the job there and here.
	j = startJob(t, ".", nil, "-H", "127.0.0.1,127.0.0.2", "-n", "4", "--ssh", ssh, rank, "-exit-rank", "2", "-code", "5")
	if st := j.wait(2 * time.Minute); st != 5 {
		t.Errorf("exit status %d, want 5\n%s", st, j.stderr.String())
	}
	if want := "* rank 2 (node 1, 127.0.0.2): exit status 5"; !strings.Contains(j.stderr.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, j.stderr.String())
	}

	// A host file with slots; SIGINT to xrcrun ends the ranks on the hosts.
	hostfile := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hostfile, []byte("# two hosts\n127.0.0.1 slots=1\n127.0.0.2 slots=3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	j = startJob(t, ".", nil, "--hostfile", hostfile, "--ssh", ssh, rank, "-join", "-hang")
	lines := j.waitLines(4, rankLine, time.Minute)
	checkRanks(t, lines, 4, func(r int) int { return min(r, 1) })
	j.cmd.Process.Signal(syscall.SIGINT)
	if st := j.wait(time.Minute); st != 130 {
		t.Errorf("exit status %d, want 130\n%s", st, j.stderr.String())
	}
}

// fakeSSH logs its arguments in $FAKE_SSH_LOG and then, by host: runs the
// remote command here for $FAKE_SSH_OK; for $FAKE_SSH_ASK, writes its pid
// to $FAKE_SSH_PID, asks for a password and stops, as ssh reading the
// terminal from the background does (SIGTTIN); for any other host, fails
// as ssh in batch mode does.
const fakeSSH = `#!/bin/sh
echo "$@" >> "$FAKE_SSH_LOG"
while [ $# -gt 2 ]; do shift; done
case "$1" in
"$FAKE_SSH_OK") exec sh -c "$2" ;;
"$FAKE_SSH_ASK")
	echo $$ > "$FAKE_SSH_PID"
	echo "$1's password: " >&2
	kill -STOP $$
	exec sleep 600 ;;
esac
echo "$1: Permission denied (publickey,password)." >&2
exit 255
`

// TestLaunchSSHUnreachable: ssh runs in batch mode; an ssh that fails has
// its message in the failure report; an agent that never connects (its ssh
// waits for a password nobody gives) fails the job after --agent-timeout,
// naming the host, and nothing of the job is left. It hung for good.
func TestLaunchSSHUnreachable(t *testing.T) {
	t.Parallel()
	_, rank := tools(t)
	dir := t.TempDir()
	ssh := filepath.Join(dir, "ssh")
	if err := os.WriteFile(ssh, []byte(fakeSSH), 0o755); err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("127.%d.%d.", 128+rand.IntN(128), rand.IntN(256))
	good, bad := prefix+"1", prefix+"2"
	log, pidFile := filepath.Join(dir, "ssh.log"), filepath.Join(dir, "ssh.pid")
	env := []string{"FAKE_SSH_LOG=" + log, "FAKE_SSH_OK=" + good, "FAKE_SSH_ASK=" + bad, "FAKE_SSH_PID=" + pidFile}

	// ssh fails on the second host.
	j := startJob(t, ".", append(env, "FAKE_SSH_ASK=none"), "-H", good+","+bad, "--ssh", ssh, rank, "-hang")
	if st := j.wait(time.Minute); st == 0 {
		t.Errorf("exit status 0 with a host ssh cannot reach\n%s", j.stderr.String())
	}
	want := "* rank 1 (node 1, " + bad + "): lost: its node agent exited before it connected (ssh " + bad +
		": exit status 255): " + bad + ": Permission denied (publickey,password)."
	if !strings.Contains(j.stderr.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, j.stderr.String())
	}
	args, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(args), "-o BatchMode=yes "+prefix); n != 2 {
		t.Errorf("ssh ran %d times with -o BatchMode=yes before the host, want 2:\n%s", n, args)
	}

	// ssh waits on the second host, stopped.
	start := time.Now()
	j = startJob(t, ".", env, "-H", good+","+bad, "--ssh", ssh, "--agent-timeout", "3s", "--grace", "1s", rank, "-hang")
	st := j.wait(time.Minute)
	if st == 0 {
		t.Errorf("exit status 0 with an agent that never connected\n%s", j.stderr.String())
	}
	if d := time.Since(start); d < 3*time.Second {
		t.Errorf("the job ended after %v, before --agent-timeout", d)
	}
	want = "* rank 1 (node 1, " + bad + "): lost: node agent on host " + bad + " did not connect within 3s (ssh " + bad +
		"): " + bad + "'s password:"
	if !strings.Contains(j.stderr.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, j.stderr.String())
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("the ssh that never started its agent is left: kill(%d, 0): %v", pid, err)
	}
}
