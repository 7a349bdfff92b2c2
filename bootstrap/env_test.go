package bootstrap

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestEnvRoundTrip(t *testing.T) {
	want := Env{Rank: 5, Size: 8, LocalRank: 1, LocalSize: 4, Node: 1, Nodes: 2, Addr: "127.0.0.1:4000",
		Key: []byte("0123456789abcdef0123456789abcdef"), JobID: "j1", Transport: "xrc", Connect: "lazy", Device: "soft1"}
	m := map[string]string{}
	for _, kv := range want.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	got, err := ReadEnv(func(k string) string { return m[k] })
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func TestEnvWorldOfOne(t *testing.T) {
	got, err := ReadEnv(func(string) string { return "" })
	if err != nil || got.Size != 1 || got.Rank != 0 || got.Nodes != 1 || got.LocalSize != 1 || got.Addr != "" {
		t.Fatalf("%+v, %v", got, err)
	}
}

func TestEnvBad(t *testing.T) {
	good := Env{Rank: 1, Size: 2, LocalSize: 1, Nodes: 1, Addr: "h:1", Key: make([]byte, 16)}
	for name, bad := range map[string]map[string]string{
		"rank not a number": {EnvRank: "x"},
		"rank >= size":      {EnvRank: "2"},
		"negative rank":     {EnvRank: "-1"},
		"node >= nodes":     {EnvNode: "1"},
		"short key":         {EnvKey: "abcd"},
		"key not hex":       {EnvKey: strings.Repeat("zz", 16)},
		"zero size":         {EnvSize: "0"},
	} {
		m := map[string]string{}
		for _, kv := range good.Environ() {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
		for k, v := range bad {
			m[k] = v
		}
		if _, err := ReadEnv(func(k string) string { return m[k] }); !errors.Is(err, ErrEnv) {
			t.Errorf("%s: err %v, want ErrEnv", name, err)
		}
	}
}
