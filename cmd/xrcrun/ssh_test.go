package main

import (
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

func TestParseHostfile(t *testing.T) {
	got, err := parseHostfile(strings.NewReader("# cluster\nnode1 slots=4\n\nnode2   # no slots\nnode1 slots=2 max_slots=8\n"))
	want := []node{{"node1", 6}, {"node2", 0}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, %v; want %v", got, err, want)
	}
	got, err = parseHostfile(strings.NewReader("node1\nnode2\nnode1\n"))
	want = []node{{"node1", 2}, {"node2", 0}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("a host listed twice without slots: got %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"", "# nothing\n", "a slots=x\n", "a slots=0\n", "a color=red\n"} {
		if _, err := parseHostfile(strings.NewReader(bad)); err == nil {
			t.Errorf("hostfile %q accepted", bad)
		}
	}
}

func TestParseHosts(t *testing.T) {
	got, err := parseHosts("a,b:3,127.0.0.2")
	want := []node{{"a", 0}, {"b", 3}, {"127.0.0.2", 0}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, %v; want %v", got, err, want)
	}
	// A host named again adds up, a listing without slots counting one,
	// as Open MPI's -H counts each listing a slot: -H a,a is two ranks
	// by default, not one.
	got, err = parseHosts("a,b,a,b:2,c:2,c")
	want = []node{{"a", 2}, {"b", 3}, {"c", 3}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("hosts named twice: got %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"", ",", "a:x", "a:0"} {
		if _, err := parseHosts(bad); err == nil {
			t.Errorf("-H %q accepted", bad)
		}
	}
}

func TestSSHCommand(t *testing.T) {
	got := sshCommand("ssh -p 2222  -o X=y", "h1", []string{"/opt/x run/xrcrun", "agent", "it's"})
	want := []string{"ssh", "-p", "2222", "-o", "X=y", "-o", "BatchMode=yes", "h1", `exec '/opt/x run/xrcrun' agent 'it'\''s'`}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	// ssh runs in batch mode (it cannot ask in the background), unless
	// the user's options say otherwise or the command is not ssh.
	for _, c := range []struct {
		ssh  string
		want []string
	}{
		{"", []string{"ssh", "-o", "BatchMode=yes", "h", "exec a"}},
		{"/usr/bin/ssh -v", []string{"/usr/bin/ssh", "-v", "-o", "BatchMode=yes", "h", "exec a"}},
		{"ssh -o batchmode=no", []string{"ssh", "-o", "batchmode=no", "h", "exec a"}},
		{"ssh -oBatchMode=no", []string{"ssh", "-oBatchMode=no", "h", "exec a"}},
		{"rsh", []string{"rsh", "h", "exec a"}},
		{"/opt/bin/my-ssh-wrapper -x", []string{"/opt/bin/my-ssh-wrapper", "-x", "h", "exec a"}},
	} {
		if got := sshCommand(c.ssh, "h", []string{"a"}); !reflect.DeepEqual(got, c.want) {
			t.Errorf("--ssh %q: got %q, want %q", c.ssh, got, c.want)
		}
	}
	// The quoting survives a real shell.
	out, err := exec.Command("sh", "-c", "printf '%s|' "+shellQuote("a b'c\"$HOME")+" "+shellQuote("")).Output()
	if err != nil || string(out) != "a b'c\"$HOME||" {
		t.Errorf("sh printed %q, %v", out, err)
	}
}
