//go:build linux

package softhca

import (
	"os"
	"syscall"
	"testing"

	"github.com/xrcrun/xrc/internal/unix"
)

// TestSharedViewMatchesMapping: the device serves a region from its view
// of the client's memfd only while the client maps that very file, at the
// file offset the view has, at the region's address: the view is used
// when it does (else every region would go through process_vm_readv/
// writev), not once the client maps another page of the same memfd there.
// The view was used whenever the inode matched, whatever the offset.
func TestSharedViewMatchesMapping(t *testing.T) {
	const pg = 4096
	fd, client, err := unix.Memfd("xrc-view", 2*pg)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	defer unix.Munmap(client)
	_, major, minor, ino, err := unix.FileStat(fd)
	if err != nil {
		t.Fatal(err)
	}
	view, err := unix.MmapShared(fd, 0, 2*pg)
	if err != nil {
		t.Fatal(err)
	}
	m := &remoteMemory{processMemory: processMemory{os.Getpid()}, maps: newMapBudget()}
	m.maps.take(len(view))
	defer m.close()
	addr := uint64(unix.AddrOf(client))
	m.addShared(addr, view, fileID{major, minor, ino})
	region := func(addr, n uint64) ([]byte, error) {
		fm, err := m.mapping(addr, n, true)
		if err != nil {
			return nil, err
		}
		return m.region(addr, n, fm)
	}
	for _, at := range []uint64{0, pg} {
		if v, err := region(addr+at, pg); err != nil || v == nil || unix.AddrOf(v) != unix.AddrOf(view)+uintptr(at) {
			t.Fatalf("region at +%d: %v, %v; want the device's view", at, v == nil, err)
		}
	}
	// The client maps page 1 of the memfd at its page 0.
	if _, _, e := syscall.Syscall6(syscall.SYS_MMAP, unix.AddrOf(client), pg, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_SHARED|syscall.MAP_FIXED, uintptr(fd), pg); e != 0 {
		t.Fatal(e)
	}
	if v, err := region(addr, pg); err != nil || v != nil {
		t.Fatalf("region over page 1 of the memfd mapped at page 0's address: view %v, %v; want none", v != nil, err)
	}
}
