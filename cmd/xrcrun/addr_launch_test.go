package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"
)

var gidLine = regexp.MustCompile(`(?m)^gid (\S+)$`)

// gidOf is the GID of an IPv4 address, as the rank prints it.
func gidOf(ip net.IP) string {
	v4 := ip.To4()
	return fmt.Sprintf("0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", v4[0], v4[1], v4[2], v4[3])
}

// TestLaunchAddresses: ranks reach their node's soft HCA through the
// environment, each emulated node has its own address, a taken address is
// avoided, and --base-addr on a taken address fails clearly.
func TestLaunchAddresses(t *testing.T) {
	t.Parallel()
	_, rank := tools(t)
	// 127.0.1.1, the first default, is taken (by this test, unless someone
	// else already holds it).
	if c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 1, 1), Port: 4791}); err == nil {
		t.Cleanup(func() { c.Close() })
	}
	j := startJob(t, ".", nil, "-n", "4", "--nodes", "2", rank, "-open")
	if st := j.wait(2 * time.Minute); st != 0 {
		t.Fatalf("exit status %d\n%s", st, j.stderr.String())
	}
	gids := map[string]int{}
	for _, m := range gidLine.FindAllStringSubmatch(j.out(), -1) {
		gids[m[1]]++
	}
	if len(gids) != 2 {
		t.Errorf("GIDs %v: want 2 devices with 2 ranks each", gids)
	}
	for g, n := range gids {
		if n != 2 || g == gidOf(net.IPv4(127, 0, 1, 1)) {
			t.Errorf("GID %s used by %d ranks", g, n)
		}
	}

	// --base-addr says exactly where: no falling back.
	base := net.IPv4(127, byte(128+rand.IntN(128)), byte(rand.IntN(256)), 1)
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: base, Port: 4791})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	j = startJob(t, ".", nil, "-n", "2", "--nodes", "2", "--base-addr", base.String(), rank, "-open")
	if st := j.wait(2 * time.Minute); st != 1 {
		t.Errorf("exit status %d, want 1\n%s", st, j.stderr.String())
	}
	if want := "rank 0 (node 0): lost: its node agent failed: soft HCA on " + base.String(); !strings.Contains(j.stderr.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, j.stderr.String())
	}
	c.Close()
	j = startJob(t, ".", nil, "-n", "2", "--nodes", "2", "--base-addr", base.String(), rank, "-open")
	if st := j.wait(2 * time.Minute); st != 0 {
		t.Fatalf("exit status %d\n%s", st, j.stderr.String())
	}
	for _, want := range []net.IP{base, net.IPv4(base[12], base[13], base[14], 2)} {
		if !strings.Contains(j.out(), "gid "+gidOf(want)+"\n") {
			t.Errorf("no rank on %s:\n%s", want, j.out())
		}
	}
}
