package comm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/xrcrun/xrc/transport/rc"
	"github.com/xrcrun/xrc/transport/xrc"
)

// Report is what one rank holds for its connections to other nodes.
type Report struct {
	Rank, Node int // world rank and node
	// Transport is what reaches the ranks of other nodes: "rc" or "xrc";
	// "shm" when the job has one node.
	Transport string
	RCQPs     int // RC QPs
	INIQPs    int // XRC send QPs: one per remote node, at most
	TGTQPs    int // XRC receive QPs this rank created; the node's other ranks open them
	SRQs      int // shared receive queues
	// QueueBytes is the memory of the QPs', SRQs' and CQs' queues;
	// RegisteredBytes the memory registered with the device.
	QueueBytes, RegisteredBytes int64
	// Connect is the time spent making and connecting QPs.
	Connect time.Duration
}

// Report describes this rank's connections now (with lazy connection,
// only the pairs that have talked have QPs).
func (c *Comm) Report() Report {
	e := c.e
	e.mu.Lock()
	defer e.mu.Unlock()
	r := Report{Rank: e.rank, Node: e.nodes[e.rank], Transport: "shm"}
	for _, tr := range e.trs {
		switch t := tr.(type) {
		case *rc.Transport:
			s := t.Stats()
			r.Transport = "rc"
			r.RCQPs += s.QPs
			r.SRQs += s.SRQs
			r.QueueBytes += s.QueueBytes
			r.RegisteredBytes += s.RegisteredBytes
			r.Connect += s.SetupTime + s.HandshakeTime
		case *xrc.Transport:
			s := t.Stats()
			r.Transport = "xrc"
			r.INIQPs += s.INIQPs
			r.TGTQPs += s.TGTCreated
			r.SRQs += s.SRQs
			r.QueueBytes += s.QueueBytes
			r.RegisteredBytes += s.RegisteredBytes
			r.Connect += s.SetupTime + s.HandshakeTime
		}
	}
	return r
}

// NodeReport sums the Reports of a node's ranks, in the form of the
// connection report's JSON.
type NodeReport struct {
	Node            int     `json:"node"`
	Ranks           int     `json:"ranks"`
	INIQPs          int     `json:"ini_qps"`
	TGTQPs          int     `json:"tgt_qps"`
	RCQPs           int     `json:"rc_qps"`
	SRQs            int     `json:"srqs"`
	QueueBytes      int64   `json:"queue_bytes"`
	RegisteredBytes int64   `json:"registered_bytes"`
	ConnectSeconds  float64 `json:"connect_seconds"` // the slowest rank of the node
	Transport       string  `json:"transport"`
}

// NodeReports gathers every rank's Report and sums them per node, in node
// order. Every rank of the world calls it; all get the result. The
// reports travel through the rendezvous, not the transports, so that
// gathering them makes no connection of its own.
func (c *Comm) NodeReports(ctx context.Context) ([]NodeReport, error) {
	if c.ctx != 0 {
		return nil, errors.New("comm: NodeReports on a communicator other than the world")
	}
	mine, err := json.Marshal(c.Report())
	if err != nil {
		return nil, err
	}
	all, err := c.boot.AllGather(ctx, mine)
	if err != nil {
		return nil, err
	}
	byNode := map[int]*NodeReport{}
	for i, b := range all {
		var r Report
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("comm: report of rank %d: %w", i, err)
		}
		n := byNode[r.Node]
		if n == nil {
			n = &NodeReport{Node: r.Node, Transport: r.Transport}
			byNode[r.Node] = n
		}
		n.Ranks++
		n.INIQPs += r.INIQPs
		n.TGTQPs += r.TGTQPs
		n.RCQPs += r.RCQPs
		n.SRQs += r.SRQs
		n.QueueBytes += r.QueueBytes
		n.RegisteredBytes += r.RegisteredBytes
		n.ConnectSeconds = max(n.ConnectSeconds, r.Connect.Seconds())
	}
	out := make([]NodeReport, 0, len(byNode))
	for _, n := range byNode {
		out = append(out, *n)
	}
	slices.SortFunc(out, func(a, b NodeReport) int { return a.Node - b.Node })
	return out, nil
}

// WriteReport gathers the NodeReports (every rank of the world calls it)
// and has rank 0 write them to w: as PrintReport does, or as one JSON
// array.
func (c *Comm) WriteReport(ctx context.Context, w io.Writer, asJSON bool) error {
	nodes, err := c.NodeReports(ctx)
	if err != nil || c.rank != 0 {
		return err
	}
	if asJSON {
		return json.NewEncoder(w).Encode(nodes)
	}
	PrintReport(w, nodes)
	return nil
}

// PrintReport prints the per-node connection report and the formulas'
// counts for the job's shape: N nodes of c ranks need c²(N−1) RC QPs per
// node, or c(N−1) XRC send and c(N−1) XRC receive QPs.
func PrintReport(w io.Writer, nodes []NodeReport) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "node\tranks\ttransport\tINI QPs\tTGT QPs\tRC QPs\tSRQs\tqueue KiB\tregistered KiB\tconnect s\t")
	c := 0
	for _, n := range nodes {
		c = max(c, n.Ranks)
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%.3f\t\n", n.Node, n.Ranks, n.Transport, n.INIQPs, n.TGTQPs,
			n.RCQPs, n.SRQs, n.QueueBytes>>10, n.RegisteredBytes>>10, n.ConnectSeconds)
	}
	tw.Flush()
	N := len(nodes)
	fmt.Fprintf(w, "formulas for %d nodes of %d ranks, per node: RC c²(N−1) = %d QPs; XRC c(N−1) INI + c(N−1) TGT = %d + %d QPs\n",
		N, c, c*c*(N-1), c*(N-1), c*(N-1))
}
