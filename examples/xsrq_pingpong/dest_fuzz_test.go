package main

import "testing"

// FuzzParseDest: any address message a peer sends either fails to parse or
// gives an address that goes out and back unchanged.
func FuzzParseDest(f *testing.F) {
	f.Add(dest{lid: 1, recvQPN: 0x800048, sendQPN: 0x49, psn: 0x21cab, srqn: 0x40, gid: [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 1}}.wire())
	f.Add([]byte("0000:800048:000049:021cab:000040:00000000000000000000ffff7f000101\x00"))
	f.Add([]byte("0000:800048:000049:021cab:000040:00000000000000000000ffff7f00010g"))
	f.Add([]byte("END\x00"))
	f.Add([]byte(":::::"))
	f.Fuzz(func(t *testing.T, msg []byte) {
		d, err := parseDest(msg)
		if err != nil {
			return
		}
		again, err := parseDest(d.wire())
		if err != nil || again != d {
			t.Fatalf("%q parsed as %+v, which goes out as %q and comes back as %+v, %v", msg, d, d.wire(), again, err)
		}
	})
}
