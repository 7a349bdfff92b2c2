package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestParseSizes(t *testing.T) {
	for _, c := range []struct {
		in     string
		lo, hi int
		bad    bool
	}{
		{"4096", 1, 4096, false},
		{"8:1024", 8, 1024, false},
		{"0:0", 0, 0, false},
		{"x", 0, 0, true},
		{"8:4", 0, 0, true},
		{"-1:4", 0, 0, true},
	} {
		lo, hi, err := parseSizes(c.in, 1)
		if (err != nil) != c.bad || !c.bad && (lo != c.lo || hi != c.hi) {
			t.Errorf("%q: %d, %d, %v", c.in, lo, hi, err)
		}
	}
}

// Without a launcher the program is a world of one, which it refuses.
func TestRunAlone(t *testing.T) {
	t.Setenv("XRC_BOOTSTRAP", "")
	t.Setenv("XRC_RUNTIME_DIR", t.TempDir())
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"-test", "bw"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "exactly 2 ranks") {
		t.Fatalf("err %v", err)
	}
	if err := run(context.Background(), []string{"-m", "8:4"}, &out, &errb); err == nil {
		t.Fatal("-m 8:4: no error")
	}
}
