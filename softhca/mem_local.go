//go:build linux

package softhca

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"os"
	"strconv"

	"github.com/xrcrun/xrc/internal/unix"
)

// localMemory is the memory of a client in the device's own process.
//
// Queue memory is what the client allocated through the device (AllocQueue)
// and registered with it; queue addresses outside it are refused, so a
// command cannot point the device at arbitrary memory. Memory regions may be
// any mapping the process has with the needed permissions; the device then
// accesses them directly, which is as safe as the region's owner keeps them
// mapped (verbs does: it pins Go memory and refuses to free Alloc'd memory
// while registered). Command responses go through process_vm_writev on the
// process itself, which fails cleanly on a bad address.
type localMemory struct {
	processMemory
	noViews bool // reach regions with process_vm_readv/writev (Device.noViews)
	queueTable
}

func newLocalMemory() *localMemory { return &localMemory{processMemory: processMemory{os.Getpid()}} }

// processMemory reaches the memory of process pid with
// process_vm_readv/writev: the read, write, readv and writev of memory.
type processMemory struct{ pid int }

func (m processMemory) read(addr uint64, b []byte) error  { return unix.ProcessVMRead(m.pid, b, addr) }
func (m processMemory) write(addr uint64, b []byte) error { return unix.ProcessVMWrite(m.pid, b, addr) }
func (m processMemory) readv(addr uint64, bs [][]byte) error {
	return unix.ProcessVMReadVec(m.pid, bs, addr)
}
func (m processMemory) writev(addr uint64, bs [][]byte) error {
	return unix.ProcessVMWriteVec(m.pid, bs, addr)
}

func (m *localMemory) mapping(addr, n uint64, write bool) (fileMapping, error) {
	return checkMapped(m.pid, addr, n, write)
}

func (m *localMemory) region(addr, n uint64, _ fileMapping) ([]byte, error) {
	if m.noViews {
		return nil, nil
	}
	return unix.Bytes(uintptr(addr), int(n)), nil
}

func (m *localMemory) close()         {}
func (m *localMemory) hold([]byte)    {}
func (m *localMemory) release([]byte) {}

// fileMapping says what maps a range of a process's memory: the file, and
// the file offset at the range's start. file.ino is 0 unless one file is
// mapped there throughout, contiguously (not anonymous memory).
type fileMapping struct {
	file fileID
	off  uint64
}

// checkMapped verifies against /proc/<pid>/maps that [addr, addr+n) is
// mapped in process pid, readable, and writable if write is set, as the
// kernel's get_user_pages would before pinning it, and returns what maps
// it.
func checkMapped(pid int, addr, n uint64, write bool) (fm fileMapping, err error) {
	end := addr + n
	if end < addr {
		return fm, unix.Errorf(unix.EINVAL, "region at %#x of %d bytes wraps", addr, n)
	}
	maps, err := readMaps(pid)
	if err != nil {
		return fm, unix.Errorf(unix.EFAULT, "read memory map: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(maps))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	cur := addr
	for sc.Scan() && cur < end {
		line := sc.Bytes()
		dash := bytes.IndexByte(line, '-')
		sp := bytes.IndexByte(line, ' ')
		if dash < 0 || sp < dash || len(line) < sp+5 {
			continue
		}
		lo, err1 := strconv.ParseUint(string(line[:dash]), 16, 64)
		hi, err2 := strconv.ParseUint(string(line[dash+1:sp]), 16, 64)
		if err1 != nil || err2 != nil || hi <= cur {
			continue
		}
		if lo > cur {
			break // a hole
		}
		perms := line[sp+1 : sp+5]
		if perms[0] != 'r' || (write && perms[1] != 'w') {
			return fm, unix.Errorf(unix.EFAULT, "memory at %#x is mapped %s", cur, perms)
		}
		here := parseMapsLine(line[sp+1:], lo, cur)
		if cur == addr {
			fm = here
		} else if here.file != fm.file || here.off != fm.off+(cur-addr) {
			fm.file.ino = 0 // another file, or the same elsewhere in it
		}
		cur = hi
	}
	if cur < end {
		return fileMapping{}, unix.Errorf(unix.EFAULT, "memory at %#x is not mapped", cur)
	}
	return fm, nil
}

// readMaps reads /proc/<pid>/maps. Tests replace it.
var readMaps = func(pid int) ([]byte, error) { return os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps") }

// parseMapsLine reads "perms offset major:minor inode [path]", the rest of
// a /proc/<pid>/maps line whose mapping starts at lo, and returns the file
// and its offset at at (within the mapping). A field that does not parse
// gives inode 0.
func parseMapsLine(rest []byte, lo, at uint64) fileMapping {
	f := bytes.Fields(rest)
	if len(f) < 4 {
		return fileMapping{}
	}
	off, err1 := strconv.ParseUint(string(f[1]), 16, 64)
	majS, minS, _ := bytes.Cut(f[2], []byte(":"))
	major, err2 := strconv.ParseUint(string(majS), 16, 32)
	minor, err3 := strconv.ParseUint(string(minS), 16, 32)
	ino, err4 := strconv.ParseUint(string(f[3]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return fileMapping{}
	}
	return fileMapping{file: fileID{uint32(major), uint32(minor), ino}, off: off + (at - lo)}
}

func putNE64(b []byte, v uint64) { binary.NativeEndian.PutUint64(b, v) }
func putNE32(b []byte, v uint32) { binary.NativeEndian.PutUint32(b, v) }
