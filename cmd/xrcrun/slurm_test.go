package main

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

func TestExpandHostlist(t *testing.T) {
	for in, want := range map[string][]string{
		"node01":               {"node01"},
		"node[01-03,7]":        {"node01", "node02", "node03", "node7"},
		"a,b[1-2],c":           {"a", "b1", "b2", "c"},
		"r[1-2]n[08-09]":       {"r1n08", "r1n09", "r2n08", "r2n09"},
		"127.0.1.[1-3]":        {"127.0.1.1", "127.0.1.2", "127.0.1.3"},
		"gpu[9-11]":            {"gpu9", "gpu10", "gpu11"},
		"x[098-100]":           {"x098", "x099", "x100"},
		"n[1],m[2-2]":          {"n1", "m2"},
		"node[01-02],login[0]": {"node01", "node02", "login0"},
	} {
		got, err := expandHostlist(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("expandHostlist(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "node[1-", "node]", "node[3-1]", "node[a-b]", "node[-1]", "n[0-99999999]",
		// Each range is allowed, their product or sum is too many hosts.
		"n[0-60000]x[0-60000]", "n[0-65536,0-65536],m[0-65536]" + strings.Repeat(",m[0-65536]", 15)} {
		if got, err := expandHostlist(bad); err == nil {
			t.Errorf("expandHostlist(%q) = %q, want an error", bad, got)
		}
	}
}

func TestExpandTasksPerNode(t *testing.T) {
	got, err := expandTasksPerNode("2(x3),1")
	if err != nil || !reflect.DeepEqual(got, []int{2, 2, 2, 1}) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "x", "2(x)", "2(x0)", "-1", "1(x65536)" + strings.Repeat(",1(x65536)", 16)} {
		if _, err := expandTasksPerNode(bad); err == nil {
			t.Errorf("expandTasksPerNode(%q) succeeded", bad)
		}
	}
}

func TestSlurmFromEnv(t *testing.T) {
	env := map[string]string{"SLURM_JOB_ID": "77", "SLURM_NODELIST": "n[1-3]", "SLURM_NTASKS": "5", "SLURM_TASKS_PER_NODE": "2(x2),1"}
	a, ok, err := slurmFromEnv(func(k string) string { return env[k] })
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	want := []node{{"n1", 2}, {"n2", 2}, {"n3", 1}}
	if a.JobID != "77" || a.Tasks != 5 || !reflect.DeepEqual(a.Nodes, want) {
		t.Errorf("got %+v", a)
	}
	if _, ok, _ := slurmFromEnv(func(string) string { return "" }); ok {
		t.Error("found an allocation in an empty environment")
	}
	env["SLURM_TASKS_PER_NODE"] = "2(x2)"
	if _, _, err := slurmFromEnv(func(k string) string { return env[k] }); err == nil {
		t.Error("a task count per node that does not match the node list was accepted")
	}
}

// In an allocation the job takes SLURM_NTASKS ranks without -n, but
// --ppn ranks on every node with --ppn (which SLURM_NTASKS may exceed).
func TestSlurmDefaultRanks(t *testing.T) {
	env := map[string]string{"SLURM_JOB_ID": "77", "SLURM_NODELIST": "n[1-2]", "SLURM_NTASKS": "8", "SLURM_TASKS_PER_NODE": "4(x2)"}
	for _, c := range []struct {
		ppn, want int
	}{{0, 8}, {2, 4}} {
		cfg := &launchConfig{ppn: c.ppn}
		mode, nodes, err := cfg.where(func(k string) string { return env[k] })
		if err != nil || mode != modeSlurm {
			t.Fatalf("ppn %d: mode %v, %v", c.ppn, mode, err)
		}
		p, err := layout(cfg.n, nodes, cfg.ppn, false)
		if n := len(p.Node); err != nil || n != c.want {
			t.Errorf("ppn %d: %d ranks (%v), want %d", c.ppn, n, err, c.want)
		}
	}
}

func TestCompressHostlist(t *testing.T) {
	for _, c := range []struct {
		hosts []string
		want  string
	}{
		{[]string{"node01", "node02", "node03", "node7"}, "node[01-03,7]"},
		{[]string{"a", "b1", "b2", "c"}, "a,b[1-2],c"},
		{[]string{"127.0.1.1", "127.0.1.2", "127.0.1.3"}, "127.0.1.[1-3]"},
		{[]string{"gpu9", "gpu10", "gpu11"}, "gpu[9-11]"},
		{[]string{"x098", "x099", "x100"}, "x[098-100]"},
		{[]string{"n1"}, "n1"},
		{[]string{"n3", "n2", "n1"}, "n[3,2,1]"},
		{[]string{"r1n1", "r1n2", "r2n1"}, "r1n[1-2],r2n1"},
		{[]string{"n1", "m1", "n2"}, "n1,m1,n2"},
		{[]string{"n0", "n00", "n01"}, "n[0,00-01]"},
		{[]string{"node1", "node1"}, "node[1,1]"},
	} {
		if got := compressHostlist(c.hosts); got != c.want {
			t.Errorf("compressHostlist(%q) = %q, want %q", c.hosts, got, c.want)
		}
	}
	// Undone by expandHostlist, and short.
	var hosts []string
	for i := range 30000 {
		hosts = append(hosts, fmt.Sprintf("node%05d", i))
		if i%1000 == 999 {
			hosts = append(hosts, fmt.Sprintf("gpu%d", i/1000))
		}
	}
	list := compressHostlist(hosts)
	back, err := expandHostlist(list)
	if err != nil || !reflect.DeepEqual(back, hosts) {
		t.Errorf("expandHostlist(compressHostlist(...)): %v", err)
	}
	if len(list) > 1000 {
		t.Errorf("compressed to %d bytes", len(list))
	}
}

// TestCompressHostlistProperty: expandHostlist(compressHostlist(h)) == h for
// random lists mixing padded and unpadded numbers, several digit groups,
// names without digits, duplicates and any order.
func TestCompressHostlistProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	prefixes := []string{"n", "node", "r1n", "r2n", "gpu-", "a1b", "x", ""}
	for iter := range 20000 {
		var hosts []string
		for range 1 + rng.IntN(12) {
			switch rng.IntN(6) {
			case 0:
				hosts = append(hosts, []string{"login", "head", "a-b"}[rng.IntN(3)])
			case 1:
				if len(hosts) > 0 {
					hosts = append(hosts, hosts[rng.IntN(len(hosts))]) // duplicate
					continue
				}
				fallthrough
			default:
				p := prefixes[rng.IntN(len(prefixes))]
				if p == "" {
					p = "z"
				}
				n := rng.IntN(120)
				w := rng.IntN(4)
				hosts = append(hosts, fmt.Sprintf("%s%0*d", p, w, n))
				for range rng.IntN(4) { // a run
					n++
					hosts = append(hosts, fmt.Sprintf("%s%0*d", p, w, n))
				}
			}
		}
		list := compressHostlist(hosts)
		back, err := expandHostlist(list)
		if err != nil || !reflect.DeepEqual(back, hosts) {
			t.Fatalf("iteration %d: %q compressed to %q expands to %q, %v", iter, hosts, list, back, err)
		}
	}
}

// TestCompressHostlistLongRun: a run of more than maxRange consecutive
// nodes is split into ranges that expandHostlist (and Slurm, whose
// hostlist.c has MAX_RANGE 64K hosts) takes.
func TestCompressHostlistLongRun(t *testing.T) {
	var hosts []string
	for i := range 140000 {
		hosts = append(hosts, fmt.Sprintf("node%06d", i))
	}
	list := compressHostlist(hosts)
	if want := "node[000000-065535,065536-131071,131072-139999]"; list != want {
		t.Errorf("compressHostlist(140000 nodes) = %q, want %q", list, want)
	}
	back, err := expandHostlist(list)
	if err != nil || !reflect.DeepEqual(back, hosts) {
		t.Errorf("%q expands to %d hosts, %v", list, len(back), err)
	}
	if _, err := expandHostlist("node[000000-065536]"); err == nil {
		t.Error("expanded a range of 65537 hosts")
	}
}
