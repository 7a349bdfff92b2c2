package main

import (
	"errors"
	"fmt"
)

// node is a place where ranks run: an emulated node on this machine, a host
// reached by ssh, or a node of a Slurm allocation.
type node struct {
	Host  string // the host name or address; empty for an emulated node
	Slots int    // how many ranks it takes; 0: not said
}

// placement is where each rank of a job runs.
type placement struct {
	Nodes []node  // the nodes that run at least one rank, in order
	Ranks [][]int // the ranks of each node, ascending
	Node  []int   // the node of each rank
}

// place maps n ranks onto nodes as mpirun does. By blocks (the default), a
// node takes ppn consecutive ranks, or its slots, or an even share of
// the ranks the nodes with slots leave (one more on the first ones when
// they do not divide, as srun does, and at least one each); byNode deals ranks round robin, one per node in turn,
// skipping nodes whose slots are full. Nodes left without ranks are
// dropped. It fails when the slots cannot hold n ranks.
func place(n int, nodes []node, ppn int, byNode bool) (placement, error) {
	if n < 1 {
		return placement{}, errors.New("placement: need at least one rank")
	}
	if len(nodes) == 0 {
		return placement{}, errors.New("placement: no nodes")
	}
	limit := make([]int, len(nodes)) // slots of each node; 0: unlimited
	total, unlimited := 0, 0
	for i, nd := range nodes {
		switch {
		case ppn > 0:
			limit[i] = ppn
		case nd.Slots > 0:
			limit[i] = nd.Slots
		default:
			unlimited++
		}
		total += limit[i]
	}
	if unlimited == 0 && total < n {
		return placement{}, fmt.Errorf("placement: %d ranks do not fit in the %d slots of %d nodes", n, total, len(nodes))
	}
	nodeOf := make([]int, n)
	count := make([]int, len(nodes))
	if byNode {
		next := 0
		for r := range n {
			for limit[next] > 0 && count[next] >= limit[next] {
				next = (next + 1) % len(nodes)
			}
			nodeOf[r] = next
			count[next]++
			next = (next + 1) % len(nodes)
		}
	} else {
		// The nodes without slots share the ranks the others do not take
		// in blocks, as srun does: the first (rest mod unlimited) take one
		// more than the others, so that every node gets some (ceil(n/K)
		// each left the last nodes empty: -n 4 --nodes 3 used two).
		rest := max(n-total, 0)
		caps := make([]int, len(nodes))
		u := 0
		for k := range nodes {
			if caps[k] = limit[k]; caps[k] == 0 {
				c := rest / unlimited
				if u < rest%unlimited {
					c++
				}
				caps[k] = max(c, 1)
				u++
			}
		}
		k := 0
		for r := range n {
			for {
				if count[k] < caps[k] {
					break
				}
				k++
			}
			nodeOf[r] = k
			count[k]++
		}
	}
	// Renumber the nodes that got ranks.
	var p placement
	index := make([]int, len(nodes))
	for i, nd := range nodes {
		index[i] = -1
		if count[i] > 0 {
			index[i] = len(p.Nodes)
			p.Nodes = append(p.Nodes, nd)
			p.Ranks = append(p.Ranks, nil)
		}
	}
	p.Node = make([]int, n)
	for r, k := range nodeOf {
		p.Node[r] = index[k]
		p.Ranks[index[k]] = append(p.Ranks[index[k]], r)
	}
	return p, nil
}

// localRank returns rank r's index among the ranks of its node.
func (p placement) localRank(r int) int {
	for i, q := range p.Ranks[p.Node[r]] {
		if q == r {
			return i
		}
	}
	panic("placement: rank not on its node")
}
