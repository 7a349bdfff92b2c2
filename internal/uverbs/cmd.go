//go:build linux

package uverbs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"structs"
	"sync"
	"unsafe"

	"github.com/xrcrun/xrc/internal/unix"
)

// Writer is a uverbs command file: the kernel's /dev/infiniband/uverbsN or a
// software device's client. Write takes one whole command (header, core
// payload, driver payload) and returns len(cmd) on success, like write(2) on
// the uverbs file; the device writes its response to the address held in the
// command's response field.
type Writer interface {
	Write(cmd []byte) (int, error)
}

// Cmd is a legacy write command without driver data: the header followed by
// the core payload.
type Cmd[T any] struct {
	_    structs.HostLayout
	Hdr  CmdHdr
	Core T
}

// ExCmd is an extended write command without driver data.
type ExCmd[T any] struct {
	_     structs.HostLayout
	Hdr   CmdHdr
	ExHdr ExCmdHdr
	Core  T
}

// HdrSize and ExHdrSize are the sizes of the command headers.
const (
	HdrSize   = int(unsafe.Sizeof(CmdHdr{}))
	ExHdrSize = int(unsafe.Sizeof(ExCmdHdr{}))
)

// ErrCommandTooLarge is returned for a command or response that does not fit
// the framing's word counts.
var ErrCommandTooLarge = errors.New("uverbs command too large")

// Conn issues commands on a Writer. Requests and responses are staged in a
// page of memory outside the Go heap, so that the response address handed to
// the device stays valid whatever the garbage collector does; Conn serializes
// commands, as the kernel's write path does per file.
type Conn struct {
	w       Writer
	mu      sync.Mutex
	scratch []byte // guarded by mu; one mmap'ed page
}

// scratchSize bounds a command plus its response.
const scratchSize = 4096

// NewConn returns a Conn issuing commands on w.
func NewConn(w Writer) (*Conn, error) {
	b, err := unix.MmapAnon(scratchSize)
	if err != nil {
		return nil, fmt.Errorf("uverbs scratch page: %w", err)
	}
	return &Conn{w: w, scratch: b}, nil
}

// Close releases the scratch page. It does not close the Writer.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.scratch == nil {
		return nil
	}
	err := unix.Munmap(c.scratch)
	c.scratch = nil
	return err
}

// Writer returns the file commands are written to.
func (c *Conn) Writer() Writer { return c.w }

func bytesOf[T any](p *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(p)), unsafe.Sizeof(*p))
}

// Exec issues the legacy write command op. req is the whole command: a struct
// that starts with a CmdHdr, followed by the core payload and any driver
// payload. resp, when not nil, receives the response; the core payload of
// every legacy command that has a response starts with the 64-bit response
// address, which Exec fills. Errors wrap the device's errno.
func Exec[Req, Resp any](c *Conn, op uint32, req *Req, resp *Resp) error {
	rb := bytesOf(req)
	var respLen int
	if resp != nil {
		respLen = int(unsafe.Sizeof(*resp))
	}
	if len(rb)%4 != 0 || respLen%4 != 0 || len(rb)/4 > 0xffff || respLen/4 > 0xffff {
		return fmt.Errorf("command %d: %w", op, ErrCommandTooLarge)
	}
	hdr := (*CmdHdr)(unsafe.Pointer(req))
	hdr.Command = op
	hdr.InWords = uint16(len(rb) / 4)
	hdr.OutWords = uint16(respLen / 4)
	return c.exec(rb, HdrSize, bytesOfOrNil(resp))
}

// ExecEx issues the extended write command op (without the extended flag,
// which ExecEx sets). req starts with a CmdHdr and an ExCmdHdr; coreLen is
// the size of its core payload, the rest being driver payload. resp, when not
// nil, receives the response, of which coreRespLen bytes are the core part.
func ExecEx[Req, Resp any](c *Conn, op uint32, req *Req, coreLen int, resp *Resp, coreRespLen int) error {
	rb := bytesOf(req)
	respLen := 0
	if resp != nil {
		respLen = int(unsafe.Sizeof(*resp))
	}
	drvLen := len(rb) - HdrSize - ExHdrSize - coreLen
	drvRespLen := respLen - coreRespLen
	if coreLen%8 != 0 || drvLen%8 != 0 || drvLen < 0 || coreRespLen%8 != 0 || drvRespLen%8 != 0 || drvRespLen < 0 {
		return fmt.Errorf("extended command %d: sizes not in 8-byte words", op)
	}
	if coreLen/8 > 0xffff || drvLen/8 > 0xffff || coreRespLen/8 > 0xffff || drvRespLen/8 > 0xffff {
		return fmt.Errorf("extended command %d: %w", op, ErrCommandTooLarge)
	}
	hdr := (*CmdHdr)(unsafe.Pointer(req))
	hdr.Command = op | CmdFlagExtended
	hdr.InWords = uint16(coreLen / 8)
	hdr.OutWords = uint16(coreRespLen / 8)
	ex := (*ExCmdHdr)(unsafe.Add(unsafe.Pointer(req), HdrSize))
	ex.ProviderInWords = uint16(drvLen / 8)
	ex.ProviderOutWords = uint16(drvRespLen / 8)
	ex.CmdHdrReserved = 0
	return c.exec(rb, HdrSize, bytesOfOrNil(resp))
}

func bytesOfOrNil[T any](p *T) []byte {
	if p == nil {
		return nil
	}
	return bytesOf(p)
}

// exec stages req in the scratch page, points the response field at respOff
// (when resp is not nil) to the staging area, writes the command and copies
// the response back.
func (c *Conn) exec(req []byte, respOff int, resp []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.scratch == nil {
		return fmt.Errorf("uverbs: %w", unix.EBADF)
	}
	if len(req)+len(resp) > len(c.scratch) {
		return ErrCommandTooLarge
	}
	sreq := c.scratch[:len(req)]
	copy(sreq, req)
	sresp := c.scratch[len(req) : len(req)+len(resp)]
	clear(sresp)
	if len(resp) > 0 {
		if len(req) < respOff+8 {
			return fmt.Errorf("command has no room for a response address")
		}
		binary.NativeEndian.PutUint64(sreq[respOff:], uint64(unix.AddrOf(sresp)))
	}
	n, err := c.w.Write(sreq)
	if err != nil {
		return unix.WrapErrno(err)
	}
	if n != len(sreq) {
		return fmt.Errorf("uverbs write: short write %d of %d", n, len(sreq))
	}
	copy(resp, sresp)
	return nil
}

// ExecNoResp issues a legacy write command that has no response.
func ExecNoResp[Req any](c *Conn, op uint32, req *Req) error {
	return Exec[Req, struct{}](c, op, req, nil)
}

// BytesOf returns the memory of *p as a byte slice.
func BytesOf[T any](p *T) []byte { return bytesOf(p) }

// Decode copies the start of b into a T, reporting false when b is shorter.
func Decode[T any](b []byte) (T, bool) {
	var t T
	n := copy(bytesOf(&t), b)
	return t, n == len(bytesOf(&t))
}
