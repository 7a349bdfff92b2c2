package shm

import (
	"encoding/binary"
	"testing"
)

// FuzzParseRecord: a rank's record, as the rendezvous hands it over, either
// fails to parse or gives the pid and inbox path it was made of.
func FuzzParseRecord(f *testing.F) {
	f.Add(append(binary.LittleEndian.AppendUint32(nil, 1234), "/dev/shm/shm-job-0"...))
	f.Add([]byte{1, 2, 3, 4})
	f.Add([]byte{})
	f.Add(make([]byte, 4097))
	f.Fuzz(func(t *testing.T, b []byte) {
		pid, path, err := parseRecord(b)
		if err != nil {
			if len(b) >= 5 && len(b) <= 4096 {
				t.Fatalf("a record of %d bytes refused: %v", len(b), err)
			}
			return
		}
		if len(path) == 0 || len(b) > 4096 {
			t.Fatalf("%d-byte record accepted, path %q", len(b), path)
		}
		if again := append(binary.LittleEndian.AppendUint32(nil, uint32(pid)), path...); string(again) != string(b) {
			t.Fatalf("record %x parsed as pid %d, path %q", b, pid, path)
		}
	})
}
