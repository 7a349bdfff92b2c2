package main

import (
	"reflect"
	"testing"
)

func TestPlace(t *testing.T) {
	emu := func(k int) []node { return make([]node, k) }
	for _, c := range []struct {
		name   string
		n      int
		nodes  []node
		ppn    int
		byNode bool
		want   []int // node of each rank
		hosts  int   // nodes kept
	}{
		{"even blocks", 8, emu(2), 0, false, []int{0, 0, 0, 0, 1, 1, 1, 1}, 2},
		{"uneven blocks", 5, emu(2), 0, false, []int{0, 0, 0, 1, 1}, 2},
		{"round robin", 5, emu(2), 0, true, []int{0, 1, 0, 1, 0}, 2},
		{"ppn", 5, emu(4), 2, false, []int{0, 0, 1, 1, 2}, 3},
		{"one node", 3, emu(1), 0, false, []int{0, 0, 0}, 1},
		{"empty nodes dropped", 2, emu(4), 0, false, []int{0, 1}, 2},
		{"slots", 5, []node{{Host: "a", Slots: 1}, {Host: "b", Slots: 4}}, 0, false, []int{0, 1, 1, 1, 1}, 2},
		{"slots round robin", 5, []node{{Host: "a", Slots: 1}, {Host: "b", Slots: 4}}, 0, true, []int{0, 1, 1, 1, 1}, 2},
		{"ppn beats slots", 4, []node{{Host: "a", Slots: 1}, {Host: "b", Slots: 1}}, 2, false, []int{0, 0, 1, 1}, 2},
	} {
		p, err := place(c.n, c.nodes, c.ppn, c.byNode)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !reflect.DeepEqual(p.Node, c.want) || len(p.Nodes) != c.hosts {
			t.Errorf("%s: nodes %v (%d kept), want %v (%d)", c.name, p.Node, len(p.Nodes), c.want, c.hosts)
		}
		for k, ranks := range p.Ranks {
			for i, r := range ranks {
				if p.Node[r] != k || p.localRank(r) != i {
					t.Errorf("%s: rank %d listed on node %d as local %d", c.name, r, k, i)
				}
			}
		}
	}
	for _, c := range []struct {
		n     int
		nodes []node
		ppn   int
	}{
		{0, emu(1), 0}, {1, nil, 0}, {5, emu(2), 2}, {3, []node{{Slots: 1}, {Slots: 1}}, 0},
	} {
		if _, err := place(c.n, c.nodes, c.ppn, false); err == nil {
			t.Errorf("place(%d, %v, ppn %d) succeeded", c.n, c.nodes, c.ppn)
		}
	}
}

func TestPlaceMixedSlots(t *testing.T) {
	p, err := place(5, []node{{Host: "a", Slots: 1}, {Host: "b"}}, 0, false)
	if err != nil || !reflect.DeepEqual(p.Node, []int{0, 1, 1, 1, 1}) {
		t.Errorf("got %v, %v", p.Node, err)
	}
}

// Without -n the job takes --ppn ranks on every node, else every node's
// slots, one on a node with none given; and the ranks fit the nodes.
func TestDefaultRanks(t *testing.T) {
	for _, c := range []struct {
		name  string
		nodes []node
		ppn   int
		want  []int // node of each rank
	}{
		{"emulated", make([]node, 3), 0, []int{0, 1, 2}},
		{"emulated, ppn", make([]node, 2), 2, []int{0, 0, 1, 1}},
		{"slots", []node{{Host: "a", Slots: 2}, {Host: "b", Slots: 1}}, 0, []int{0, 0, 1}},
		{"slots, ppn", []node{{Host: "a", Slots: 4}, {Host: "b", Slots: 4}}, 2, []int{0, 0, 1, 1}},
		{"a host without slots", []node{{Host: "a", Slots: 2}, {Host: "b"}, {Host: "c", Slots: 1}}, 0, []int{0, 0, 1, 2}},
	} {
		p, err := layout(0, c.nodes, c.ppn, false)
		if err != nil || !reflect.DeepEqual(p.Node, c.want) {
			t.Errorf("%s: ranks placed on %v, %v; want %v", c.name, p.Node, err, c.want)
		}
	}
}

// --map-by node without -n: a host given without slots was counted as
// one rank but taken as unlimited, so it got two of the four ranks of
// -H a,b:3 and b only two of its three. It holds the one rank it was
// counted for; with -n it still takes any number.
func TestDefaultRanksByNode(t *testing.T) {
	for _, c := range []struct {
		name  string
		n     int
		nodes []node
		ppn   int
		want  []int // node of each rank
	}{
		{"a host without slots", 0, []node{{Host: "a"}, {Host: "b", Slots: 3}}, 0, []int{0, 1, 1, 1}},
		{"hosts without slots", 0, []node{{Host: "a"}, {Host: "b", Slots: 2}, {Host: "c"}}, 0, []int{0, 1, 2, 1}},
		{"emulated", 0, make([]node, 3), 0, []int{0, 1, 2}},
		{"ppn", 0, []node{{Host: "a"}, {Host: "b", Slots: 3}}, 2, []int{0, 1, 0, 1}},
		{"-n given", 4, []node{{Host: "a"}, {Host: "b", Slots: 3}}, 0, []int{0, 1, 0, 1}},
		{"-n given, more", 10, []node{{Host: "a"}, {Host: "b", Slots: 3}}, 0, []int{0, 1, 0, 1, 0, 1, 0, 0, 0, 0}},
	} {
		p, err := layout(c.n, c.nodes, c.ppn, true)
		if err != nil || !reflect.DeepEqual(p.Node, c.want) {
			t.Errorf("%s: ranks placed on %v, %v; want %v", c.name, p.Node, err, c.want)
		}
	}
}

// TestUnevenNodesAllUsed: --nodes K with a rank count K does not divide
// uses all K nodes, in blocks (srun's 2,1,1 for -n 4 on 3); a share of
// ceil(n/K) per node left the last nodes empty.
func TestUnevenNodesAllUsed(t *testing.T) {
	for _, c := range []struct{ n, k int }{{4, 3}, {5, 4}, {7, 4}, {10, 4}} {
		p, err := place(c.n, make([]node, c.k), 0, false)
		if err != nil {
			t.Fatal(err)
		}
		counts := make([]int, len(p.Ranks))
		for i, r := range p.Ranks {
			counts[i] = len(r)
		}
		if len(p.Nodes) != c.k || counts[0]-counts[len(counts)-1] > 1 {
			t.Errorf("-n %d --nodes %d: %d nodes used, ranks per node %v", c.n, c.k, len(p.Nodes), counts)
		}
	}
}

// --ppn limits every node, those given without slots too, with -n as
// without: docs/xrcrun.md said a node without slots takes any number
// once -n is given, and is never full for --map-by node.
func TestPPNLimitsNodesWithoutSlots(t *testing.T) {
	nodes := []node{{Host: "a"}, {Host: "b", Slots: 3}}
	for _, byNode := range []bool{false, true} {
		if p, err := layout(10, nodes, 2, byNode); err == nil {
			t.Errorf("-H a,b:3 -n 10 --ppn 2 (by node %v): placed on %v, want an error", byNode, p.Node)
		}
		if p, err := layout(4, nodes, 2, byNode); err != nil || len(p.Ranks[0]) != 2 || len(p.Ranks[1]) != 2 {
			t.Errorf("-H a,b:3 -n 4 --ppn 2 (by node %v): %v, %v; want 2 ranks a node", byNode, p.Ranks, err)
		}
	}
}

// Block placement gives a node without slots at least one rank, even
// when the nodes with slots could take them all: -H a,b,c:3 -n 4 puts
// 1, 1 and 2 (docs/xrcrun.md gave the share as the rest of the ranks,
// shared, which would put 1, 0 and 3).
func TestShareAtLeastOne(t *testing.T) {
	p, err := layout(4, []node{{Host: "a"}, {Host: "b"}, {Host: "c", Slots: 3}}, 0, false)
	if want := []int{0, 1, 2, 2}; err != nil || !reflect.DeepEqual(p.Node, want) {
		t.Errorf("-H a,b,c:3 -n 4: %v, %v; want %v", p.Node, err, want)
	}
}
