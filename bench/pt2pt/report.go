package pt2pt

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Report is a test's results and where they were measured.
type Report struct {
	Test     Test   `json:"test"`
	SameNode bool   `json:"same_node"`
	Where    string `json:"where"` // e.g. "one node (shared memory)"
	// Transport is what the launcher asked for between nodes
	// (XRC_TRANSPORT: rc, xrc or auto), empty when it said nothing.
	Transport string   `json:"transport,omitempty"`
	Results   []Result `json:"results"`
}

// Title is the first line of the table, after OSU's "# OSU MPI Latency
// Test" and "# OSU MPI Bandwidth Test".
func (t Test) Title() string {
	if t == TestBandwidth {
		return "xrc comm Bandwidth Test (bench/osu, as osu_bw)"
	}
	return "xrc comm Latency Test (bench/osu, as osu_latency)"
}

// WriteTable prints rep as OSU prints its tables: two comment lines (the
// test, then the columns), then one line per size. Lines starting with #
// are comments to tools that parse OSU output; WriteTable adds one saying
// where the ranks ran.
func WriteTable(w io.Writer, rep Report) error {
	col := "Latency (us)"
	if rep.Test == TestBandwidth {
		col = "Bandwidth (MB/s)"
	}
	where := rep.Where
	if rep.Transport != "" && !rep.SameNode {
		where += ", transport " + rep.Transport
	}
	if _, err := fmt.Fprintf(w, "# %s\n# %s\n%-10s%18s\n", rep.Test.Title(), where, "# Size", col); err != nil {
		return err
	}
	for _, r := range rep.Results {
		v := r.LatencyUS
		if rep.Test == TestBandwidth {
			v = r.MBps
		}
		if _, err := fmt.Fprintf(w, "%-10d%18.2f\n", r.Size, v); err != nil {
			return err
		}
	}
	return nil
}

// WriteJSON prints rep as one JSON object.
func WriteJSON(w io.Writer, rep Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteGoBench prints rep in Go's benchmark format, one line per size, so
// that benchstat can compare runs. An operation is one message: for the
// latency test N is twice the round trips and ns/op the one-way latency;
// for the bandwidth test N is the messages of the timed windows and MB/s
// the bandwidth.
func WriteGoBench(w io.Writer, rep Report) error {
	name := "Latency"
	if rep.Test == TestBandwidth {
		name = "Bandwidth"
	}
	place := "internode"
	if rep.SameNode {
		place = "intranode"
	}
	for _, r := range rep.Results {
		var err error
		if rep.Test == TestBandwidth {
			n := r.Iters * r.Window
			_, err = fmt.Fprintf(w, "BenchmarkOSU%s/%s/size=%d\t%d\t%.1f ns/op\t%.2f MB/s\n", name, place, r.Size, n,
				float64(r.Elapsed.Nanoseconds())/float64(n), r.MBps)
		} else {
			_, err = fmt.Fprintf(w, "BenchmarkOSU%s/%s/size=%d\t%d\t%.1f ns/op\n", name, place, r.Size, 2*r.Iters,
				r.LatencyUS*1e3)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Row is one line of an OSU table: a size and its latency (µs) or
// bandwidth (MB/s).
type Row struct {
	Size  int
	Value float64
}

// ParseTable reads a table in OSU's format (WriteTable's, or an OSU
// benchmark's): comment lines starting with #, one of them the column
// header "# Size ...", then rows of a size and a non-negative number,
// sizes increasing. Lines after the table that are not rows (Go
// benchmark lines) end it.
func ParseTable(s string) ([]Row, error) {
	var rows []Row
	header := false
	for i, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		if strings.HasPrefix(l, "#") {
			if rows != nil {
				return nil, fmt.Errorf("line %d: a comment after the rows: %q", i+1, l)
			}
			header = header || strings.HasPrefix(l, "# Size")
			continue
		}
		if strings.HasPrefix(l, "Benchmark") && rows != nil {
			break
		}
		if !header {
			return nil, fmt.Errorf("line %d: a row before the column header: %q", i+1, l)
		}
		f := strings.Fields(l)
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: %d fields: %q", i+1, len(f), l)
		}
		size, err1 := strconv.Atoi(f[0])
		v, err2 := strconv.ParseFloat(f[1], 64)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		if size < 0 || v < 0 || len(rows) > 0 && size <= rows[len(rows)-1].Size {
			return nil, fmt.Errorf("line %d: size %d, value %v after %v", i+1, size, v, rows)
		}
		rows = append(rows, Row{size, v})
	}
	if !header {
		return nil, errors.New("no column header")
	}
	return rows, nil
}
