package unix

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestProcessVMVec reads this process's own memory into runs of buffers,
// and writes them back: one call's worth, more than one call's (the
// 64-buffer bound), with empty buffers among them, and at an address that
// is not mapped.
func TestProcessVMVec(t *testing.T) {
	src := make([]byte, 4096)
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	addr := uint64(AddrOf(src))
	for _, sizes := range [][]int{
		{100},
		{1, 0, 300, 17, 0},
		repeat(7, 130), // three system calls
		repeat(0, 70),
	} {
		var bufs [][]byte
		total := 0
		for _, n := range sizes {
			bufs = append(bufs, make([]byte, n))
			total += n
		}
		if err := ProcessVMReadVec(os.Getpid(), bufs, addr+5); err != nil {
			t.Fatalf("sizes %v: %v", sizes, err)
		}
		if got := bytes.Join(bufs, nil); !bytes.Equal(got, src[5:5+total]) {
			t.Fatalf("sizes %v: read %x, want %x", sizes, got, src[5:5+total])
		}

		// And back, into a copy of src whose bytes were changed.
		for _, b := range bufs {
			for i := range b {
				b[i] ^= 0x5a
			}
		}
		dst := bytes.Clone(src)
		if err := ProcessVMWriteVec(os.Getpid(), bufs, uint64(AddrOf(dst))+5); err != nil {
			t.Fatalf("sizes %v: write: %v", sizes, err)
		}
		want := bytes.Clone(src)
		copy(want[5:], bytes.Join(bufs, nil))
		if !bytes.Equal(dst, want) {
			t.Fatalf("sizes %v: wrote %x, want %x", sizes, dst, want)
		}
	}

	// A page no access reaches (PROT_NONE, so that no other mapping can
	// take its place during the test): the error says EFAULT.
	page, err := MmapAnon(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer Munmap(page)
	if err := unix.Mprotect(page, unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	gone := uint64(AddrOf(page))
	err = ProcessVMReadVec(os.Getpid(), [][]byte{make([]byte, 8), make([]byte, 8)}, gone)
	if !errors.Is(err, EFAULT) {
		t.Fatalf("read of unmapped memory: %v, want EFAULT", err)
	}
	err = ProcessVMWriteVec(os.Getpid(), [][]byte{make([]byte, 8), make([]byte, 8)}, gone)
	if !errors.Is(err, EFAULT) {
		t.Fatalf("write to unmapped memory: %v, want EFAULT", err)
	}
}

func repeat(n, times int) []int {
	s := make([]int, times)
	for i := range s {
		s[i] = n
	}
	return s
}
