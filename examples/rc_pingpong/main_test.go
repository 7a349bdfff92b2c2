package main

import (
	"bytes"
	"context"
	"regexp"
	"testing"

	"github.com/xrcrun/xrc/verbs"
)

func TestSelf(t *testing.T) {
	for _, args := range [][]string{
		{"-self", "-n", "200", "-s", "64"},
		{"-self", "-n", "50", "-s", "100000", "-m", "2048", "-c"},
		{"-self", "-e", "-n", "100", "-s", "8"},
	} {
		var out, errb bytes.Buffer
		if err := run(context.Background(), args, &out, &errb); err != nil {
			t.Fatalf("%v: %v\n%s%s", args, err, out.String(), errb.String())
		}
		for _, re := range []string{
			`(?m)^  local address:  LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID ::ffff:127\.0\.1\.25[01]$`,
			`(?m)^\d+ bytes in \d+\.\d\d seconds = \d+\.\d\d Mbit/sec$`,
			`(?m)^\d+ iters in \d+\.\d\d seconds = \d+\.\d\d usec/iter$`,
		} {
			if n := len(regexp.MustCompile(re).FindAllString(out.String(), -1)); n != 2 {
				t.Fatalf("%v: %d lines match %s in\n%s", args, n, re, out.String())
			}
		}
		if bytes.Contains(out.Bytes(), []byte("invalid data")) {
			t.Fatalf("%v: %s", args, out.String())
		}
	}
}

func TestDestWire(t *testing.T) {
	d := dest{lid: 0x12, qpn: 0xabcdef, psn: 0x123456, gid: verbs.GID{0: 0xfe, 1: 0x80, 15: 1}}
	msg := d.wire()
	if len(msg) != 52 || string(msg[:51]) != "0012:abcdef:123456:fe800000000000000000000000000001" || msg[51] != 0 {
		t.Fatalf("wire form %q", msg)
	}
	got, err := parseDest(msg)
	if err != nil || got != d {
		t.Fatalf("parsed %+v, %v", got, err)
	}
	if _, err := parseDest([]byte("0012:abcdef:123456:zz")); err == nil {
		t.Fatal("bad message parsed")
	}
}
