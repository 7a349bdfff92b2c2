package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// slurmAlloc is the Slurm allocation xrcrun runs inside, from the variables
// sbatch and salloc set.
type slurmAlloc struct {
	JobID string
	Nodes []node // the allocation's nodes, slots from SLURM_TASKS_PER_NODE
	Tasks int    // SLURM_NTASKS; 0 if not set
}

// slurmFromEnv returns the allocation that getenv describes, or false
// outside one (no SLURM_JOB_ID or no node list).
func slurmFromEnv(getenv func(string) string) (slurmAlloc, bool, error) {
	a := slurmAlloc{JobID: getenv("SLURM_JOB_ID")}
	list := getenv("SLURM_JOB_NODELIST")
	if list == "" {
		list = getenv("SLURM_NODELIST")
	}
	if a.JobID == "" || list == "" {
		return slurmAlloc{}, false, nil
	}
	hosts, err := expandHostlist(list)
	if err != nil {
		return slurmAlloc{}, true, fmt.Errorf("slurm: SLURM_NODELIST: %w", err)
	}
	for _, h := range hosts {
		a.Nodes = append(a.Nodes, node{Host: h})
	}
	if v := getenv("SLURM_NTASKS"); v != "" {
		if a.Tasks, err = strconv.Atoi(v); err != nil || a.Tasks < 1 {
			return slurmAlloc{}, true, fmt.Errorf("slurm: SLURM_NTASKS=%q is not a number of tasks", v)
		}
	}
	if v := getenv("SLURM_TASKS_PER_NODE"); v != "" {
		per, err := expandTasksPerNode(v)
		if err != nil {
			return slurmAlloc{}, true, fmt.Errorf("slurm: SLURM_TASKS_PER_NODE: %w", err)
		}
		if len(per) != len(hosts) {
			return slurmAlloc{}, true, fmt.Errorf("slurm: SLURM_TASKS_PER_NODE=%q names %d nodes, SLURM_NODELIST %d", v, len(per), len(hosts))
		}
		for i := range a.Nodes {
			a.Nodes[i].Slots = per[i]
		}
	}
	return a, true, nil
}

// maxHosts bounds the names a host list or a task count list expands
// to: a garbled one must not take the launcher's memory.
const maxHosts = 1 << 20

// maxRange is the most hosts one range of a host list may name, as for
// Slurm (MAX_RANGE in its hostlist.c: "Too many hosts in range").
const maxRange = 1 << 16

// expandHostlist expands a Slurm host list: "node[01-03,7],gpu1" is node01,
// node02, node03, node7, gpu1. Brackets may appear in several parts of a
// name ("r[1-2]n[1-2]" is r1n1, r1n2, r2n1, r2n2); ranges keep the width of
// their zero-padded bounds.
func expandHostlist(list string) ([]string, error) {
	var out []string
	for _, item := range splitTop(list) {
		if item == "" {
			continue
		}
		names, err := expandHost(item)
		if err != nil {
			return nil, err
		}
		if len(names) > maxHosts-len(out) {
			return nil, fmt.Errorf("the host list names more than %d hosts", maxHosts)
		}
		out = append(out, names...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty host list %q", list)
	}
	return out, nil
}

// splitTop splits s at the commas outside brackets.
func splitTop(s string) []string {
	var parts []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, s[start:])
}

func expandHost(item string) ([]string, error) {
	open := strings.IndexByte(item, '[')
	if open < 0 {
		if strings.ContainsRune(item, ']') {
			return nil, fmt.Errorf("unbalanced ] in %q", item)
		}
		return []string{item}, nil
	}
	end := strings.IndexByte(item[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("unbalanced [ in %q", item)
	}
	end += open
	prefix, body, rest := item[:open], item[open+1:end], item[end+1:]
	tails, err := expandHost(rest)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range strings.Split(body, ",") {
		lo, hi, ranged := strings.Cut(r, "-")
		if !ranged {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a > b || lo == "" {
			return nil, fmt.Errorf("bad range %q in %q", r, item)
		}
		if b-a >= maxRange {
			return nil, fmt.Errorf("range %q in %q is too large: more than %d hosts", r, item, maxRange)
		}
		width := 0
		if len(lo) > 1 && lo[0] == '0' {
			width = len(lo)
		}
		if (b-a+1)*len(tails) > maxHosts-len(out) {
			return nil, fmt.Errorf("%q names more than %d hosts", item, maxHosts)
		}
		for v := a; v <= b; v++ {
			for _, t := range tails {
				out = append(out, fmt.Sprintf("%s%0*d%s", prefix, width, v, t))
			}
		}
	}
	return out, nil
}

// expandTasksPerNode expands SLURM_TASKS_PER_NODE: "2(x3),1" is 2, 2, 2, 1.
func expandTasksPerNode(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		count, times := part, "1"
		if i := strings.Index(part, "(x"); i >= 0 && strings.HasSuffix(part, ")") {
			count, times = part[:i], part[i+2:len(part)-1]
		}
		c, err1 := strconv.Atoi(count)
		t, err2 := strconv.Atoi(times)
		if err1 != nil || err2 != nil || c < 0 || t < 1 || t > 1<<16 {
			return nil, fmt.Errorf("bad element %q in %q", part, s)
		}
		if t > maxHosts-len(out) {
			return nil, fmt.Errorf("%q counts more than %d hosts", s, maxHosts)
		}
		for range t {
			out = append(out, c)
		}
	}
	return out, nil
}

// srunCommand is the command that starts one agent on each of hosts: srun
// (or $XRC_SRUN, split at spaces) with one task per node, killing the step
// when one of them fails. The node list is compressed: one argument, as one
// environment string, is limited to 128 KiB.
func srunCommand(hosts []string, agent []string) []string {
	srun := strings.Fields(os.Getenv(envSrun))
	if len(srun) == 0 {
		srun = []string{"srun"}
	}
	k := strconv.Itoa(len(hosts))
	return append(append(srun, "--nodes="+k, "--ntasks="+k, "--ntasks-per-node=1",
		"--nodelist="+compressHostlist(hosts), "--kill-on-bad-exit=1", "--cpu-bind=none"), agent...)
}

// slurmNodeIndex is the node an agent started by srun runs: its task
// number, one task per node.
func slurmNodeIndex(getenv func(string) string) (int, error) {
	for _, v := range []string{"SLURM_PROCID", "SLURM_NODEID"} {
		if s := getenv(v); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return 0, fmt.Errorf("slurm: %s=%q", v, s)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("slurm: agent started without SLURM_PROCID or SLURM_NODEID")
}

// compressHostlist is a Slurm host list of hosts, in their order:
// consecutive numbers at the end of names with the same prefix make
// ranges ("n01,n02,n03,n7" is "n[01-03,7]") of at most maxRange hosts.
// expandHostlist undoes it.
func compressHostlist(hosts []string) string {
	type run struct {
		prefix   string
		width    int // of zero-padded numbers; 0: not padded
		lo, hi   int
		numbered bool
	}
	var runs []run
	for _, h := range hosts {
		i := len(h)
		for i > 0 && h[i-1] >= '0' && h[i-1] <= '9' {
			i--
		}
		n, err := strconv.Atoi(h[i:])
		if i == len(h) || err != nil || n > 1<<30 || strings.ContainsAny(h, "[],") {
			runs = append(runs, run{prefix: h})
			continue
		}
		if k := len(runs) - 1; k >= 0 && runs[k].numbered && runs[k].prefix == h[:i] && runs[k].hi < n &&
			runs[k].hi-runs[k].lo+1 < maxRange && fmt.Sprintf("%0*d", runs[k].width, runs[k].hi+1) == h[i:] {
			runs[k].hi++
			continue
		}
		width := 0
		if len(h)-i > 1 && h[i] == '0' {
			width = len(h) - i
		}
		runs = append(runs, run{prefix: h[:i], width: width, lo: n, hi: n, numbered: true})
	}
	var b strings.Builder
	for k := 0; k < len(runs); {
		r := runs[k]
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(r.prefix)
		if !r.numbered {
			k++
			continue
		}
		end := k + 1
		for end < len(runs) && runs[end].numbered && runs[end].prefix == r.prefix {
			end++
		}
		if end == k+1 && r.lo == r.hi {
			fmt.Fprintf(&b, "%0*d", r.width, r.lo)
			k++
			continue
		}
		b.WriteByte('[')
		for i, r := range runs[k:end] {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%0*d", r.width, r.lo)
			if r.hi > r.lo {
				fmt.Fprintf(&b, "-%0*d", r.width, r.hi)
			}
		}
		b.WriteByte(']')
		k = end
	}
	return b.String()
}
