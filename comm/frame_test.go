package comm

import (
	"bytes"
	"errors"
	"testing"

	"github.com/xrcrun/xrc/transport"
)

func FuzzParseFrame(f *testing.F) {
	for _, h := range []header{
		{kind: kindEager, ctx: 1, src: 2, tag: 3, length: 5},
		{kind: kindRTS, ctx: 1, src: 0, tag: 9, length: 1 << 20, id: 77},
		{kind: kindFIN, id: 77},
	} {
		b := make([]byte, hdrLen)
		h.put(b)
		switch h.kind {
		case kindEager:
			b = append(b, "hello"...)
		case kindRTS:
			b = append(b, bytes.Repeat([]byte{1}, 20)...)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, body, err := parseFrame(b)
		if err != nil {
			if !errors.Is(err, errFrame) {
				t.Fatal(err)
			}
			return
		}
		// A frame that decodes encodes back to the same header.
		out := make([]byte, hdrLen)
		h.put(out)
		if !bytes.Equal(out[4:], b[4:hdrLen]) || out[0] != b[0] {
			t.Fatalf("header % x re-encodes as % x", b[:hdrLen], out)
		}
		if !bytes.Equal(body, b[hdrLen:]) || h.src < 0 || h.tag < 0 {
			t.Fatalf("header %+v, body of %d bytes from a frame of %d", h, len(body), len(b))
		}
		// What the receiver relies on, by kind.
		switch h.kind {
		case kindEager:
			if uint64(len(body)) != h.length {
				t.Fatal("eager length")
			}
		case kindRTS:
			if len(body) == 0 || len(body) > transport.MaxRemote {
				t.Fatalf("RTS with a Remote of %d bytes", len(body))
			}
		case kindFIN, kindPush:
			if len(body) != 0 {
				t.Fatalf("kind %d with a body of %d bytes", h.kind, len(body))
			}
		case kindData:
			if len(body) == 0 {
				t.Fatal("empty data frame")
			}
		default:
			t.Fatalf("kind %d accepted", h.kind)
		}
	})
}
