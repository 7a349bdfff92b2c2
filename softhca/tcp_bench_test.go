package softhca_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"
)

// The baseline a user would otherwise reach for: Go's TCP on loopback
// between two processes, measured as the HCA benchmarks are.

// envTCP makes the test binary a TCP peer: "echo" returns what it reads,
// "sink" reads everything and answers each 1 MiB with one byte.
const envTCP = "XRC_TEST_TCP"

func tcpPeer(mode string) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(ln.Addr())
	c, err := ln.Accept()
	if err != nil {
		return 1
	}
	if mode == "echo" {
		io.Copy(c, c)
		return 0
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			return 0
		}
		if _, err := c.Write(buf[:1]); err != nil {
			return 0
		}
	}
}

// dialPeer starts a TCP peer process and connects to it.
func dialPeer(b *testing.B, mode string) net.Conn {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envTCP+"="+mode)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	c, err := net.Dial("tcp", addr[:len(addr)-1])
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// BenchmarkTCPBaseline measures an 8-byte round trip (median and 99th
// percentile) and a one-way 1 MiB stream between two processes over
// loopback TCP.
func BenchmarkTCPBaseline(b *testing.B) {
	b.Run("rtt-8B", func(b *testing.B) {
		c := dialPeer(b, "echo")
		buf := make([]byte, 8)
		var lat []time.Duration
		for b.Loop() {
			t0 := time.Now()
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	})
	b.Run("stream-1MiB", func(b *testing.B) {
		c := dialPeer(b, "sink")
		buf := make([]byte, 1<<20)
		ack := make([]byte, 16)
		b.SetBytes(int64(len(buf)))
		unacked := 0
		for b.Loop() {
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
			unacked++
			for unacked > 16 { // as many in flight as the HCA benchmark
				n, err := c.Read(ack)
				if err != nil {
					b.Fatal(err)
				}
				unacked -= n
			}
		}
		for unacked > 0 {
			n, err := c.Read(ack)
			if err != nil {
				b.Fatal(err)
			}
			unacked -= n
		}
	})
}
