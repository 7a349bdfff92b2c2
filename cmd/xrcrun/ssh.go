package main

import (
	"bufio"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
)

// parseHostfile reads an Open MPI style host file: one host per line,
// optionally followed by slots=N (max_slots=N is accepted and ignored);
// '#' starts a comment. A host named twice adds up its slots (addHost).
func parseHostfile(r io.Reader) ([]node, error) {
	var nodes []node
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(text)
		if len(f) == 0 {
			continue
		}
		nd := node{Host: f[0]}
		for _, kv := range f[1:] {
			k, v, ok := strings.Cut(kv, "=")
			n, err := strconv.Atoi(v)
			if !ok || err != nil || n < 1 {
				return nil, fmt.Errorf("hostfile line %d: %q is not slots=N", line, kv)
			}
			switch k {
			case "slots":
				nd.Slots = n
			case "max_slots", "max-slots":
			default:
				return nil, fmt.Errorf("hostfile line %d: unknown attribute %q", line, k)
			}
		}
		nodes = addHost(nodes, nd)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("hostfile: %w", err)
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("hostfile: no hosts")
	}
	return nodes, nil
}

// parseHosts reads -H: comma-separated hosts, each optionally host:slots.
func parseHosts(s string) ([]node, error) {
	var nodes []node
	for _, h := range strings.Split(s, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			continue
		}
		nd := node{Host: h}
		if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.Contains(h[:i], ":") {
			n, err := strconv.Atoi(h[i+1:])
			if err != nil || n < 1 {
				return nil, fmt.Errorf("-H: %q is not host or host:slots", h)
			}
			nd = node{Host: h[:i], Slots: n}
		}
		nodes = addHost(nodes, nd)
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("-H: no hosts in %q", s)
	}
	return nodes, nil
}

// addHost adds nd to nodes. A host named again adds up its slots, a
// listing without slots counting one, as in Open MPI (-H a,a is two
// slots): a host gets a slot count once it is named twice.
func addHost(nodes []node, nd node) []node {
	for i := range nodes {
		if nodes[i].Host == nd.Host {
			nodes[i].Slots = max(nodes[i].Slots, 1) + max(nd.Slots, 1)
			return nodes
		}
	}
	return append(nodes, nd)
}

// sshCommand is the command that runs agent on host: the ssh command (the
// --ssh flag, else $XRC_SSH, else "ssh"; split at spaces), the host, and
// the agent's command line quoted for the remote shell.
//
// An ssh command gets -o BatchMode=yes, unless its options set BatchMode
// themselves: ssh runs in the background (a process group of its own, its
// output held back until its agent connects), where it cannot ask for a
// password or to accept a host key. Asking, it stopped for good on reading
// the terminal (SIGTTIN); in batch mode it fails at once, and what it says
// goes in the failure report. A command that is not ssh (a wrapper script)
// is run as given.
func sshCommand(ssh, host string, agent []string) []string {
	cmd := strings.Fields(ssh)
	if len(cmd) == 0 {
		cmd = []string{"ssh"}
	}
	if filepath.Base(cmd[0]) == "ssh" && !strings.Contains(strings.ToLower(ssh), "batchmode") {
		cmd = append(cmd, "-o", "BatchMode=yes")
	}
	quoted := make([]string, len(agent))
	for i, a := range agent {
		quoted[i] = shellQuote(a)
	}
	return append(cmd, host, "exec "+strings.Join(quoted, " "))
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,@+%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
