//go:build linux

package softhca

import (
	"encoding/binary"
	"errors"
	"unsafe"

	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
)

// request is one decoded write command.
type request struct {
	c      *Client
	op     uint32
	ext    bool
	in     []byte // the core payload followed by the driver payload
	resp   uint64 // where the response goes
	outLen int    // room for the response (core and driver)

	// mapped is, for REG_MR, what the client's /proc/<pid>/maps said of
	// the region, read before d.mu was taken (prepare); nil for other
	// commands, and for a payload too short to parse, which the handler
	// refuses before it looks.
	mapped *mapCheck
}

// mapCheck is the outcome of memory.mapping.
type mapCheck struct {
	fm  fileMapping
	err error
}

// prepare does the part of a command that needs no device state and may
// take long, before the command takes d.mu, which every client and the
// engine wait for: REG_MR's read of the client's memory map.
func (r *request) prepare() {
	if r.op != uverbs.CmdRegMR { // run has refused extended commands
		return
	}
	req, _, err := payload[uverbs.RegMR](r)
	if err != nil {
		return // the handler reports it
	}
	fm, err := r.c.mem.mapping(req.Start, req.Length, regMRWrites(req.AccessFlags))
	r.mapped = &mapCheck{fm, err}
}

// handler executes a command and returns its response: the core response
// followed by the driver response.
type handler func(d *Device, r *request) ([]byte, error)

var handlers map[uint32]handler

func init() {
	handlers = map[uint32]handler{
		uverbs.CmdGetContext:        (*Device).cmdGetContext,
		uverbs.CmdQueryDevice:       (*Device).cmdQueryDevice,
		uverbs.CmdQueryPort:         (*Device).cmdQueryPort,
		uverbs.CmdAllocPD:           (*Device).cmdAllocPD,
		uverbs.CmdDeallocPD:         (*Device).cmdDeallocPD,
		uverbs.CmdRegMR:             (*Device).cmdRegMR,
		uverbs.CmdDeregMR:           (*Device).cmdDeregMR,
		uverbs.CmdCreateCompChannel: (*Device).cmdCreateCompChannel,
		uverbs.CmdCreateCQ:          (*Device).cmdCreateCQ,
		uverbs.CmdDestroyCQ:         (*Device).cmdDestroyCQ,
		uverbs.CmdCreateSRQ:         (*Device).cmdCreateSRQ,
		uverbs.CmdModifySRQ:         (*Device).cmdModifySRQ,
		uverbs.CmdQuerySRQ:          (*Device).cmdQuerySRQ,
		uverbs.CmdDestroySRQ:        (*Device).cmdDestroySRQ,
		uverbs.CmdCreateQP:          (*Device).cmdCreateQP,
		uverbs.CmdModifyQP:          (*Device).cmdModifyQP,
		uverbs.CmdQueryQP:           (*Device).cmdQueryQP,
		uverbs.CmdDestroyQP:         (*Device).cmdDestroyQP,
		uverbs.CmdOpenXRCD:          (*Device).cmdOpenXRCD,
		uverbs.CmdCloseXRCD:         (*Device).cmdCloseXRCD,
		uverbs.CmdCreateXSRQ:        (*Device).cmdCreateXSRQ,
		uverbs.CmdOpenQP:            (*Device).cmdOpenQP,
	}
}

// Write executes one uverbs write command, as write(2) on the kernel's
// uverbs file does: it checks the framing, runs the command, writes the
// response to the address in the command, and returns len(cmd) or an error
// wrapping the errno the kernel would return. Malformed commands are
// counted in Counters().BadCommands and change nothing.
func (c *Client) Write(cmd []byte) (int, error) {
	r, err := c.parse(cmd)
	if err == nil {
		err = c.run(r)
	}
	if err != nil {
		if c.d.debug {
			c.d.log.Debug("command failed", "len", len(cmd), "err", err)
		}
		var errno unix.Errno
		if errors.As(err, &errno) && (errno == unix.EINVAL || errno == unix.EFAULT || errno == unix.ENOSPC || errno == unix.EOPNOTSUPP) {
			c.d.counters.BadCommands.Add(1)
		}
		return 0, err
	}
	return len(cmd), nil
}

// parse checks the framing as ib_uverbs_write does.
func (c *Client) parse(cmd []byte) (*request, error) {
	var hdr uverbs.CmdHdr
	if len(cmd) < uverbs.HdrSize {
		return nil, unix.Errorf(unix.EINVAL, "command of %d bytes, shorter than its header", len(cmd))
	}
	hdr, _ = uverbs.Decode[uverbs.CmdHdr](cmd)
	if hdr.Command&^uint32(uverbs.CmdCommandMask|uverbs.CmdFlagExtended) != 0 {
		return nil, unix.Errorf(unix.EINVAL, "command word %#x has unknown bits", hdr.Command)
	}
	r := &request{c: c, op: hdr.Command & uverbs.CmdCommandMask}
	if hdr.Command&uverbs.CmdFlagExtended == 0 {
		if int(hdr.InWords)*4 != len(cmd) {
			return nil, unix.Errorf(unix.EINVAL, "in_words %d does not match the %d bytes written", hdr.InWords, len(cmd))
		}
		r.in = cmd[uverbs.HdrSize:]
		r.outLen = int(hdr.OutWords) * 4
		if r.outLen > 0 {
			if len(r.in) < 8 {
				return nil, unix.Errorf(unix.EINVAL, "command with a response but no response field")
			}
			r.resp = binary.NativeEndian.Uint64(r.in)
		}
		return r, nil
	}
	r.ext = true
	if len(cmd) < uverbs.HdrSize+uverbs.ExHdrSize {
		return nil, unix.Errorf(unix.EINVAL, "extended command of %d bytes, shorter than its headers", len(cmd))
	}
	ex, _ := uverbs.Decode[uverbs.ExCmdHdr](cmd[uverbs.HdrSize:])
	if ex.CmdHdrReserved != 0 {
		return nil, unix.Errorf(unix.EINVAL, "extended header reserved field is %#x", ex.CmdHdrReserved)
	}
	if (int(hdr.InWords)+int(ex.ProviderInWords))*8 != len(cmd)-uverbs.HdrSize-uverbs.ExHdrSize {
		return nil, unix.Errorf(unix.EINVAL, "in_words %d+%d do not match the %d bytes written", hdr.InWords, ex.ProviderInWords, len(cmd))
	}
	r.in = cmd[uverbs.HdrSize+uverbs.ExHdrSize:]
	r.outLen = (int(hdr.OutWords) + int(ex.ProviderOutWords)) * 8
	r.resp = ex.Response
	if r.outLen > 0 && r.resp == 0 {
		return nil, unix.Errorf(unix.EFAULT, "extended command with a response length but no response address")
	}
	return r, nil
}

func (c *Client) run(r *request) error {
	d := c.d
	if r.ext {
		// No extended command is implemented: they are all optional.
		return unix.Errorf(unix.EOPNOTSUPP, "extended command %d", r.op)
	}
	h, ok := handlers[r.op]
	if !ok {
		return unix.Errorf(unix.EOPNOTSUPP, "command %d", r.op)
	}
	// Check that the response can be written before the command changes
	// anything, so that a bad response address leaves no trace.
	if r.outLen > 0 {
		var zeros [maxResponse]byte
		if err := c.mem.write(r.resp, zeros[:min(r.outLen, maxResponse)]); err != nil {
			return err
		}
	}
	r.prepare()
	d.mu.Lock()
	if c.closed || d.closed {
		d.mu.Unlock()
		return unix.Error(unix.EIO, "device or client closed")
	}
	if !c.hasContext && r.op != uverbs.CmdGetContext {
		d.mu.Unlock()
		return unix.Errorf(unix.EINVAL, "command %d before GET_CONTEXT", r.op)
	}
	resp, err := h(d, r)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	if len(resp) == 0 {
		return nil
	}
	if r.outLen == 0 {
		return nil // the caller asked for no response
	}
	return c.mem.write(r.resp, resp[:min(len(resp), r.outLen)])
}

// maxResponse bounds the responses of the commands the device knows.
const maxResponse = 256

// payload decodes the core request T of r and returns the driver data after
// it.
func payload[T any](r *request) (T, []byte, error) {
	t, ok := uverbs.Decode[T](r.in)
	if !ok {
		return t, nil, unix.Errorf(unix.ENOSPC, "command %d: %d bytes for a %d-byte request", r.op, len(r.in), unsafe.Sizeof(t))
	}
	return t, r.in[unsafe.Sizeof(t):], nil
}

// driverData decodes the driver request D at the start of drv.
func driverData[D any](r *request, drv []byte) (D, error) {
	d, ok := uverbs.Decode[D](drv)
	if !ok {
		return d, unix.Errorf(unix.EINVAL, "command %d: %d bytes of driver data, need %d", r.op, len(drv), unsafe.Sizeof(d))
	}
	return d, nil
}

// response lays out a core response and a driver response as the client
// expects them, and checks that the core part fits.
func response[C, D any](r *request, core *C, drv *D) ([]byte, error) {
	n := int(unsafe.Sizeof(*core))
	if r.outLen < n {
		return nil, unix.Errorf(unix.ENOSPC, "command %d: %d bytes of room for a %d-byte response", r.op, r.outLen, n)
	}
	b := append([]byte(nil), uverbs.BytesOf(core)...)
	if drv != nil {
		b = append(b, uverbs.BytesOf(drv)...)
	}
	return b, nil
}

// noDriver is the driver part of responses without one.
type noDriver = struct{}
