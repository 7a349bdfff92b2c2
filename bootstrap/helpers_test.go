package bootstrap

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// long bounds every wait in the tests so that a bug fails instead of
// hanging; nothing is asserted about how long anything takes.
const long = 2 * time.Minute

var testKey = []byte("0123456789abcdef0123456789abcdef")

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), long)
	t.Cleanup(cancel)
	return ctx
}

type testServer struct {
	*Server
	reg    *prometheus.Registry
	served chan error // Serve's result
}

func startServer(t *testing.T, cfg ServerConfig) *testServer {
	t.Helper()
	if cfg.Key == nil {
		cfg.Key = testKey
	}
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	srv, err := Listen(t.Context(), "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: srv, reg: reg, served: make(chan error, 1)}
	go func() { ts.served <- srv.Serve(context.Background()) }()
	t.Cleanup(func() { srv.Close() })
	return ts
}

// result waits for Serve to return.
func (ts *testServer) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-ts.served:
		return err
	case <-time.After(long):
		t.Fatal("Serve did not return")
		return nil
	}
}

// metric returns the value of a counter or gauge (with the given label
// pairs) in reg, 0 if absent.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				if !hasLabel(m, labels[i], labels[i+1]) {
					continue next
				}
			}
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	return 0
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// joinAll joins n ranks concurrently; rank r's endpoint is "ep-r".
func joinAll(t *testing.T, addr string, n int) []*Client {
	t.Helper()
	ctx := testCtx(t)
	cs := make([]*Client, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			me := Member{Rank: r, Node: r / 4, LocalRank: r % 4, Endpoint: fmt.Appendf(nil, "ep-%d", r)}
			cs[r], errs[r] = Join(ctx, addr, testKey, me, n, ClientConfig{})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range cs {
			c.Close()
		}
	})
	return cs
}

// each runs f for every client concurrently and fails on any error.
func each(t *testing.T, cs []*Client, f func(r int, c *Client) error) {
	t.Helper()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// rawConn is a connection that speaks the protocol by hand.
type rawConn struct {
	net.Conn
	fc *frameConn
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(long))
	m := newClientMetrics(nil)
	return &rawConn{Conn: nc, fc: newFrameConn(nc, m.bytesIn, m.bytesOut)}
}

// authenticate runs the rank's side of the handshake with key.
func (rc *rawConn) authenticate(t *testing.T, key []byte) {
	t.Helper()
	if err := dialHandshake(rc.fc, key, rand.Reader); err != nil {
		t.Fatal(err)
	}
}

// drain reads until the server closes the connection and returns the
// frames' types.
func (rc *rawConn) drain() []msgType {
	var ts []msgType
	r := bufio.NewReader(rc.Conn)
	for {
		t, _, err := readFrame(r, maxFromServer)
		if err != nil {
			return ts
		}
		ts = append(ts, t)
	}
}

// waitFor polls cond until it holds (or fails the test after long).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(long)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(time.Millisecond)
	}
}
