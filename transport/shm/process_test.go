package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/xrcrun/xrc/internal/unix"
)

// The other process of the cross-process tests is this test binary again,
// started with XRC_SHM_PEER=<dir>: it makes its inbox in dir, maps the
// test's, and echoes every frame back until an empty one, which ends it
// whatever it holds. A frame of 16 bytes starting with "pull" is a
// request: the peer fills a buffer of the length it names and answers with
// its address, and keeps the buffer until a frame of 16 bytes starting
// with "pulled" says the test has pulled it (pulledFrame). It ends on its
// own if the test process goes away.
func TestMain(m *testing.M) {
	if dir := os.Getenv("XRC_SHM_PEER"); dir != "" {
		if err := peer(dir); err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func peer(dir string) error {
	in, err := CreateInbox(filepath.Join(dir, "peer"), 1, 1<<16)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := OpenOutbox(filepath.Join(dir, "test"), 0)
	if err != nil {
		return err
	}
	defer out.Close()
	c := in.Ring(0)
	parent := os.Getppid()
	var held []byte // a buffer the test pulls; kept alive until it says so
	for {
		f, err := c.Next()
		if err != nil {
			return err
		}
		if f == nil {
			if in.Spin(50 * time.Microsecond) {
				continue
			}
			if err := in.Wait(time.Second); err != nil {
				return err
			}
			if os.Getppid() != parent {
				return errors.New("the test process is gone")
			}
			continue
		}
		if len(f) == 0 {
			c.Release()
			return nil
		}
		if bytes.Equal(f, pulledFrame[:]) {
			c.Release()
			held = nil
			continue
		}
		if len(f) == 16 && bytes.HasPrefix(f, []byte("pull")) {
			n := int(binary.LittleEndian.Uint64(f[8:]))
			c.Release()
			held = make([]byte, n)
			for i := range held {
				held[i] = byte(i * 7)
			}
			var ans [16]byte
			binary.LittleEndian.PutUint64(ans[:], uint64(unix.AddrOf(held)))
			binary.LittleEndian.PutUint64(ans[8:], uint64(n))
			if err := writeFor(out, ans[:], peerPatience); err != nil {
				return err
			}
			continue
		}
		if err := writeFor(out, f, peerPatience); err != nil {
			return err
		}
		c.Release()
	}
}

// pulledFrame tells the peer that the buffer it offered was pulled.
var pulledFrame = [16]byte{'p', 'u', 'l', 'l', 'e', 'd'}

// peerPatience bounds how long either process of a cross-process test
// waits for the other to make room in a ring or to end: a slow, loaded
// machine takes milliseconds, a hang forever.
const peerPatience = 30 * time.Second

// writeFor writes frame f into out, retrying while the ring is full, for
// at most d.
func writeFor(out *Outbox, f []byte, d time.Duration) error {
	deadline := time.Now().Add(d)
	for i := 0; ; i++ {
		ok, err := out.Write(f)
		if err != nil || ok {
			return err
		}
		if i&1023 == 1023 {
			if time.Now().After(deadline) {
				return fmt.Errorf("ring full for %v", d)
			}
			time.Sleep(10 * time.Microsecond)
		}
	}
}

// peerPair is the test's side: its inbox, and an outbox to the peer
// process.
type peerPair struct {
	in  *Inbox
	out *Outbox
	cmd *exec.Cmd
}

func startPeer(t testing.TB) *peerPair {
	dir := t.TempDir()
	in, err := CreateInbox(filepath.Join(dir, "test"), 1, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "XRC_SHM_PEER="+dir)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pp := &peerPair{in: in, cmd: cmd}
	// The peer ends at the empty frame, whatever the test left it doing
	// (a test that failed may leave it holding a buffer to pull); one
	// that does not end in time is killed, and the test fails.
	t.Cleanup(func() {
		if pp.out != nil {
			if err := writeFor(pp.out, nil, peerPatience); err != nil {
				t.Errorf("end the peer: %v", err)
			}
			pp.out.Close()
		}
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		select {
		case err := <-waited:
			if err != nil {
				t.Errorf("peer: %v", err)
			}
		case <-time.After(peerPatience):
			cmd.Process.Kill()
			t.Errorf("peer did not end in %v; killed: %v", peerPatience, <-waited)
		}
		in.Close()
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		if pp.out, err = OpenOutbox(filepath.Join(dir, "peer"), 0); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal(err)
		}
	}
	if pp.out.Owner() != cmd.Process.Pid {
		t.Fatalf("inbox owner %d, peer pid %d", pp.out.Owner(), cmd.Process.Pid)
	}
	return pp
}

func (pp *peerPair) send(t testing.TB, f []byte) {
	if err := writeFor(pp.out, f, peerPatience); err != nil {
		t.Fatal(err)
	}
}

// recv waits for the next frame, spinning a little and then sleeping;
// the caller releases it.
func (pp *peerPair) recv(t testing.TB) []byte {
	c := pp.in.Ring(0)
	deadline := time.Now().Add(30 * time.Second)
	for {
		f, err := c.Next()
		if err != nil {
			t.Fatal(err)
		}
		if f != nil {
			return f
		}
		if pp.in.Spin(50 * time.Microsecond) {
			continue
		}
		{
			if time.Now().After(deadline) {
				t.Fatal("no frame from the peer in 30 s")
			}
			if err := pp.in.Wait(time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestCrossProcess echoes frames of many sizes through another process
// and pulls a buffer out of it with one copy.
func TestCrossProcess(t *testing.T) {
	pp := startPeer(t)
	for i := range 2000 {
		f := frame(uint64(i), 1+i%pp.out.Ring().MaxFrame()) // an empty frame ends the peer
		pp.send(t, f)
		got := pp.recv(t)
		if !bytes.Equal(got, f) {
			t.Fatalf("echo %d: %d bytes back, want %d", i, len(got), len(f))
		}
		pp.in.Ring(0).Release()
	}
	const n = 3<<20 + 5
	addr, got := pp.requestPull(t, n)
	dst := make([]byte, got)
	if err := Pull(pp.cmd.Process.Pid, addr, dst); err != nil {
		t.Fatal(err)
	}
	for i := range dst {
		if dst[i] != byte(i*7) {
			t.Fatalf("pulled byte %d is %d", i, dst[i])
		}
	}
	pp.send(t, pulledFrame[:])
}

func (pp *peerPair) requestPull(t testing.TB, n int) (addr uint64, length int) {
	var req [16]byte
	copy(req[:], "pull")
	binary.LittleEndian.PutUint64(req[8:], uint64(n))
	pp.send(t, req[:])
	ans := pp.recv(t)
	addr, length = binary.LittleEndian.Uint64(ans), int(binary.LittleEndian.Uint64(ans[8:]))
	pp.in.Ring(0).Release()
	if length != n {
		t.Fatalf("peer offers %d bytes, want %d", length, n)
	}
	return addr, length
}

// BenchmarkPingPong: an 8-byte frame to another process and back; ns/op
// is the round trip (half of it is the one-way latency MPI benchmarks
// report).
func BenchmarkPingPong(b *testing.B) {
	pp := startPeer(b)
	f := make([]byte, 8)
	for b.Loop() {
		pp.send(b, f)
		pp.recv(b)
		pp.in.Ring(0).Release()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2/1000, "us-one-way")
}

// BenchmarkPull: 1 MiB moved out of another process with one copy.
func BenchmarkPull(b *testing.B) {
	pp := startPeer(b)
	const n = 1 << 20
	addr, _ := pp.requestPull(b, n)
	dst := make([]byte, n)
	b.SetBytes(n)
	for b.Loop() {
		if err := Pull(pp.cmd.Process.Pid, addr, dst); err != nil {
			b.Fatal(err)
		}
	}
	pp.send(b, pulledFrame[:])
}
