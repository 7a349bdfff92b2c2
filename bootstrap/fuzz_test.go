package bootstrap

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FuzzDecode feeds a stream of frames to the decoder. Every frame either
// fails with ErrProtocol or decodes to a message that encodes back to the
// same bytes.
func FuzzDecode(f *testing.F) {
	for _, m := range seedMessages() {
		f.Add(appendFrame(nil, m))
	}
	f.Add(append(appendFrame(nil, &msgLeave{}), appendFrame(nil, &msgGet{ID: 1, Key: "k"})...))
	f.Add([]byte{byte(tGathered), 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReader(bytes.NewReader(data))
		for {
			typ, p, err := readFrame(r, 1<<16)
			if err != nil {
				if err != io.EOF && !errors.Is(err, ErrProtocol) {
					t.Fatalf("readFrame: %v is neither EOF nor a protocol error", err)
				}
				return
			}
			m, err := decodeMessage(typ, p)
			if err != nil {
				if !errors.Is(err, ErrProtocol) || reasonOf(err) == "other" {
					t.Fatalf("decode %v: %v", typ, err)
				}
				continue
			}
			if m.typ() != typ {
				t.Fatalf("a %v frame decoded to a %v", typ, m.typ())
			}
			if got, want := appendFrame(nil, m), frame(typ, p); !bytes.Equal(got, want) {
				t.Fatalf("%v: re-encoded\n%x\nfrom\n%x", typ, got, want)
			}
		}
	})
}

func seedMessages() []message {
	var hello msgHello
	copy(hello.Magic[:], magic)
	hello.Version = protoVersion
	return []message{
		&hello, &msgChallenge{Magic: hello.Magic, Version: 1}, &msgAuth{},
		&msgRegister{Rank: 1, Size: 2, Node: 1, LocalRank: 0, Endpoint: []byte("ep")},
		&msgReject{Code: rejectRegister, Text: "no"},
		&msgReady{Members: []Member{{Rank: 0, Endpoint: []byte("a")}, {Rank: 1, Node: 1}}},
		&msgGather{Seq: 3, Kind: kindAllGather, Rec: []byte("rec")}, &msgGather{Seq: 4, Kind: kindBarrier},
		&msgGathered{Seq: 3, Recs: [][]byte{[]byte("a"), nil}}, &msgGathered{Seq: 4},
		&msgPut{ID: 1, Key: "k", Val: []byte("v")}, &msgPutDone{ID: 1, Err: "x"},
		&msgGet{ID: 2, Key: "k"}, &msgGot{ID: 2, Val: []byte("v")},
		&msgAbort{Rank: -1, Reason: "r"}, &msgAbort{Rank: 3, Lost: true}, &msgAbort{Rank: 2, Blamed: true, Reason: "b"}, &msgLeave{}, &msgCancel{ID: 7},
	}
}

// fuzzConn is a connection whose peer sends the fuzzer's bytes and
// ignores what it is sent.
type fuzzConn struct{ io.Reader }

func (fuzzConn) Write(p []byte) (int, error)      { return len(p), nil }
func (fuzzConn) Close() error                     { return nil }
func (fuzzConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (fuzzConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (fuzzConn) SetDeadline(time.Time) error      { return nil }
func (fuzzConn) SetReadDeadline(time.Time) error  { return nil }
func (fuzzConn) SetWriteDeadline(time.Time) error { return nil }

// The fuzz targets' nonces are fixed, so that seeds can carry valid proofs
// and the fuzzer can get past the handshake.
var (
	fuzzClientNonce = bytes.Repeat([]byte{0xc1}, nonceLen)
	fuzzServerNonce = bytes.Repeat([]byte{0x5e}, nonceLen)
)

type repeatReader []byte

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = r[i%len(r)]
	}
	return len(p), nil
}

// rankBytes is what a rank of a job of size sends: the handshake with a
// valid proof, its registration, then more.
func rankBytes(rank, size uint32, more ...message) []byte {
	var hello msgHello
	copy(hello.Magic[:], magic)
	hello.Version = protoVersion
	copy(hello.Nonce[:], fuzzClientNonce)
	b := appendFrame(nil, &hello)
	b = appendFrame(b, &msgAuth{Proof: proof(testKey, labelClient, fuzzServerNonce, fuzzClientNonce)})
	b = appendFrame(b, &msgRegister{Rank: rank, Size: size, Endpoint: []byte("ep")})
	for _, m := range more {
		b = appendFrame(b, m)
	}
	return b
}

// eofReader notes whether its reader returned io.EOF: whether the server
// read the connection to its end, rather than stopping before.
type eofReader struct {
	r   io.Reader
	eof bool
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		e.eof = true
	}
	return n, err
}

// rejections are the counters of what the server refuses from a
// connection: a failed proof, a bad message (any reason), a refused
// registration, a request past a bound.
var rejections = []string{
	"xrc_bootstrap_server_auth_failures_total",
	"xrc_bootstrap_server_bad_messages_total",
	"xrc_bootstrap_server_rejected_total",
	"xrc_bootstrap_server_refused_requests_total",
}

// rejected sums the rejection counters of reg, over all their labels.
func rejected(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if slices.Contains(rejections, mf.GetName()) {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// FuzzServerConn feeds the fuzzer's bytes to a job of one rank as that
// rank's connection: the handshake, the registration and the requests.
// The server must neither panic nor hang, and must count what it rejects:
// a connection it stops reading before its end (the peer sent no EOF) was
// refused, and one of the rejection counters must say so.
func FuzzServerConn(f *testing.F) {
	f.Add(rankBytes(0, 1))
	f.Add(rankBytes(0, 1, &msgGather{Seq: 0, Kind: kindAllGather, Rec: []byte("r")}, &msgGather{Seq: 1, Kind: kindBarrier},
		&msgPut{ID: 1, Key: "k", Val: []byte("v")}, &msgGet{ID: 2, Key: "k"}, &msgGet{ID: 3, Key: "q"},
		&msgPut{ID: 4, Key: "q", Val: []byte("w")}, &msgPut{ID: 5, Key: "q", Val: []byte("x")}, &msgLeave{}))
	f.Add(rankBytes(0, 1, &msgAbort{Reason: "stop"}, &msgGather{Seq: 0, Kind: kindBarrier}))
	f.Add(rankBytes(0, 1, &msgGather{Seq: 1, Kind: kindBarrier}))
	f.Add(rankBytes(0, 1, &msgLeave{}, &msgLeave{}))
	f.Add(rankBytes(1, 1))
	f.Add(rankBytes(0, 2))
	f.Add(appendFrame(nil, &msgHello{Magic: [4]byte{'X', 'R', 'C', 'B'}, Version: 2}))
	f.Add([]byte{byte(tHello), 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		reg := prometheus.NewRegistry()
		s := newServer(ServerConfig{Size: 1, Key: testKey, Registerer: reg}, nil)
		s.rand = repeatReader(fuzzServerNonce)
		in := &eofReader{r: bytes.NewReader(data)}
		c := newSconn(fuzzConn{in}, s.m)
		s.conns[c] = struct{}{}
		s.handshakes++
		s.wg.Add(1)
		s.serveConn(c)
		if !in.eof && rejected(t, reg) == 0 {
			t.Fatalf("the server stopped reading %d bytes before their end, counting no rejection", len(data))
		}
		if s.Joined() == 1 {
			select {
			case <-s.finished:
			default:
				t.Fatal("the only rank is gone but the job did not finish")
			}
		}
	})
}

// serverBytes is what the server of a job of size sends a rank: the
// challenge with a valid proof, the member table, then more.
func serverBytes(size int, more ...message) []byte {
	ch := msgChallenge{Version: protoVersion}
	copy(ch.Magic[:], magic)
	copy(ch.Nonce[:], fuzzServerNonce)
	ch.Proof = proof(testKey, labelServer, fuzzClientNonce, fuzzServerNonce)
	b := appendFrame(nil, &ch)
	ready := msgReady{}
	for r := range size {
		ready.Members = append(ready.Members, Member{Rank: r, Endpoint: []byte{byte(r)}})
	}
	b = appendFrame(b, &ready)
	for _, m := range more {
		b = appendFrame(b, m)
	}
	return b
}

// FuzzClientConn feeds the fuzzer's bytes to rank 0 of a job of two as
// its server's: the handshake, the member table and the replies. The
// client must neither panic nor hang, and end with an error.
func FuzzClientConn(f *testing.F) {
	f.Add(serverBytes(2))
	f.Add(serverBytes(2, &msgGathered{Seq: 0, Recs: [][]byte{{1}, {2}}}, &msgPutDone{ID: 1}, &msgGot{ID: 2, Val: []byte("v")},
		&msgGathered{Seq: 1}, &msgAbort{Rank: 1, Lost: true, Reason: "gone"}))
	f.Add(serverBytes(2, &msgGathered{Seq: 0, Recs: [][]byte{{1}}}))
	f.Add(serverBytes(3))
	f.Add(appendFrame(nil, &msgReject{Code: rejectAuth, Text: "no"}))
	f.Add(append(serverBytes(0)[:70], appendFrame(nil, &msgReject{Code: rejectRegister, Text: "dup"})...))
	f.Fuzz(func(t *testing.T, data []byte) {
		c := newClient(Member{Rank: 0}, 2, ClientConfig{})
		nc := fuzzConn{bytes.NewReader(data)}
		c.nc, c.fc = nc, newFrameConn(nc, c.m.bytesIn, c.m.bytesOut)
		// Calls waiting as the replies come.
		ch := make(chan reply, 1)
		c.colls[0], c.reqs[1], c.reqs[2] = ch, make(chan reply, 1), make(chan reply, 1)
		if err := c.register(testKey, nil, repeatReader(fuzzClientNonce)); err != nil {
			return
		}
		if len(c.members) != 2 {
			t.Fatalf("registered with %d members", len(c.members))
		}
		c.readLoop()
		if c.Err() == nil {
			t.Fatal("the stream ended but the client did not")
		}
		select {
		case r := <-ch:
			if len(r.recs) != 0 && len(r.recs) != 2 {
				t.Fatalf("an all-gather of %d records", len(r.recs))
			}
		default:
		}
	})
}

// TestFuzzSeedsAuthenticate checks that the fuzz seeds with proofs get
// past the handshake, so that the fuzzers reach what lies behind it.
func TestFuzzSeedsAuthenticate(t *testing.T) {
	s := newServer(ServerConfig{Size: 1, Key: testKey}, nil)
	s.rand = repeatReader(fuzzServerNonce)
	c := newSconn(fuzzConn{bytes.NewReader(rankBytes(0, 1, &msgPut{ID: 1, Key: "k", Val: []byte("v")}, &msgLeave{}))}, s.m)
	s.conns[c] = struct{}{}
	s.handshakes++
	s.wg.Add(1)
	s.serveConn(c)
	if s.Joined() != 1 || string(s.kv["k"]) != "v" || s.abort != nil {
		t.Fatalf("joined %d, kv %q, abort %v", s.Joined(), s.kv, s.abort)
	}

	cl := newClient(Member{Rank: 0}, 2, ClientConfig{})
	nc := fuzzConn{bytes.NewReader(serverBytes(2))}
	cl.nc, cl.fc = nc, newFrameConn(nc, cl.m.bytesIn, cl.m.bytesOut)
	if err := cl.register(testKey, nil, repeatReader(fuzzClientNonce)); err != nil || len(cl.members) != 2 {
		t.Fatalf("members %v, %v", cl.members, err)
	}
}
