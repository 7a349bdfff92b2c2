//go:build linux

package softhca

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/xrcrun/xrc/internal/unix"
)

// The device service protocol: messages on a unix SOCK_SEQPACKET socket,
// one request and then its reply at a time. Every request starts with its
// type; every reply with the type it answers and an errno (0 for success).
// Integers are little-endian. Descriptors travel as SCM_RIGHTS.
//
//	hello        version u32, 0 u32, probe u64, nonce [16]byte
//	             -> deviceInfo; fds: the bell ring memfd, the device's eventfd
//	info         -> deviceInfo (asks nothing of the device: for listings)
//	command      a uverbs write command, its response written by the device
//	             into the client's memory as the kernel does
//	             -> n u32, then n device-assigned ids i32 of the event files
//	             passed as n fds (GET_CONTEXT's async fd, a completion channel)
//	addQueue     addr u64, len u64; fd: the memfd that holds the queue memory,
//	             which the client maps at addr
//	removeQueue  addr u64
//	counters     -> repeated { name_len u8, name, value u64 }
//	addRegion    addr u64, len u64; fd: the memfd of memory the client maps
//	             at addr and registers memory regions in (verbs.Alloc's)
//
// On failure a reply carries the errno and, as its body, a message.
//
// deviceInfo is: node GUID u64, GID [16]byte, active MTU u32, name_len u32,
// name.

const protoVersion = 1

type msgType uint32

const (
	msgHello msgType = 1 + iota
	msgInfo
	msgCommand
	msgAddQueue
	msgRemoveQueue
	msgCounters
	msgAddRegion
)

func (t msgType) String() string {
	names := [...]string{"hello", "info", "command", "addQueue", "removeQueue", "counters", "addRegion"}
	if t >= msgHello && int(t-msgHello) < len(names) {
		return names[t-msgHello]
	}
	return fmt.Sprintf("message %d", uint32(t))
}

// maxMessage bounds every message and reply.
const maxMessage = 16 << 10

// errMalformed is the error of a message that does not parse.
var errMalformed = errors.New("malformed message")

// hello is the first request of a client.
type hello struct {
	version uint32
	probe   uint64   // address of nonce in the client's memory
	nonce   [16]byte // what the device must read there
}

func (h *hello) append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(msgHello))
	b = binary.LittleEndian.AppendUint32(b, h.version)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, h.probe)
	return append(b, h.nonce[:]...)
}

func parseHello(body []byte) (hello, error) {
	var h hello
	if len(body) != 32 {
		return h, fmt.Errorf("hello of %d bytes: %w", len(body), errMalformed)
	}
	h.version = binary.LittleEndian.Uint32(body)
	if binary.LittleEndian.Uint32(body[4:]) != 0 {
		return h, fmt.Errorf("hello with reserved word %#x: %w", binary.LittleEndian.Uint32(body[4:]), errMalformed)
	}
	h.probe = binary.LittleEndian.Uint64(body[8:])
	copy(h.nonce[:], body[16:])
	return h, nil
}

// deviceInfo is what a client learns of a device when it connects.
type deviceInfo struct {
	guid uint64
	gid  [16]byte
	mtu  uint32
	name string
}

func (i *deviceInfo) append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, i.guid)
	b = append(b, i.gid[:]...)
	b = binary.LittleEndian.AppendUint32(b, i.mtu)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(i.name)))
	return append(b, i.name...)
}

func parseDeviceInfo(b []byte) (deviceInfo, error) {
	var i deviceInfo
	if len(b) < 32 {
		return i, fmt.Errorf("device info of %d bytes: %w", len(b), errMalformed)
	}
	i.guid = binary.LittleEndian.Uint64(b)
	copy(i.gid[:], b[8:24])
	i.mtu = binary.LittleEndian.Uint32(b[24:])
	n := binary.LittleEndian.Uint32(b[28:])
	if uint64(n) != uint64(len(b)-32) || n > maxNameLen {
		return i, fmt.Errorf("device name of %d bytes in %d: %w", n, len(b)-32, errMalformed)
	}
	i.name = string(b[32:])
	return i, nil
}

// splitRequest returns a request's type and body.
func splitRequest(b []byte) (msgType, []byte, error) {
	if len(b) < 4 {
		return 0, nil, fmt.Errorf("request of %d bytes: %w", len(b), errMalformed)
	}
	return msgType(binary.LittleEndian.Uint32(b)), b[4:], nil
}

// request header plus fixed body, for the small requests.
func appendRequest(b []byte, t msgType, words ...uint64) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(t))
	for _, w := range words {
		b = binary.LittleEndian.AppendUint64(b, w)
	}
	return b
}

// parseWords parses a body of exactly n 64-bit words.
func parseWords(t msgType, body []byte, n int) ([]uint64, error) {
	if len(body) != 8*n {
		return nil, fmt.Errorf("%v of %d bytes: %w", t, len(body), errMalformed)
	}
	w := make([]uint64, n)
	for i := range w {
		w[i] = binary.LittleEndian.Uint64(body[8*i:])
	}
	return w, nil
}

// appendReply starts a reply to t with the errno of err (0 if nil) and, on
// failure, its message as the body.
func appendReply(b []byte, t msgType, err error) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(t))
	if err == nil {
		return binary.LittleEndian.AppendUint32(b, 0)
	}
	var errno unix.Errno
	if !errors.As(err, &errno) {
		errno = unix.EIO
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(errno))
	msg := err.Error()
	return append(b, msg[:min(len(msg), 1024)]...)
}

// parseReply checks that b answers t and returns its body, or the error it
// carries.
func parseReply(b []byte, t msgType) ([]byte, error) {
	if len(b) < 8 {
		return nil, fmt.Errorf("reply of %d bytes: %w", len(b), errMalformed)
	}
	if got := msgType(binary.LittleEndian.Uint32(b)); got != t {
		return nil, fmt.Errorf("reply to %v answers %v: %w", t, got, errMalformed)
	}
	if errno := unix.Errno(binary.LittleEndian.Uint32(b[4:])); errno != 0 {
		// The message is the device's error, which ends with the errno's
		// text; unix.Error adds it again.
		msg := strings.TrimSuffix(string(b[8:]), ": "+errno.Error())
		return nil, unix.Error(errno, msg)
	}
	return b[8:], nil
}

// appendIDs appends the ids of the event files a command reply passes.
func appendIDs(b []byte, ids []int32) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ids)))
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	return b
}

func parseIDs(body []byte) ([]int32, error) {
	if len(body) < 4 {
		return nil, fmt.Errorf("command reply of %d bytes: %w", len(body), errMalformed)
	}
	n := binary.LittleEndian.Uint32(body)
	if uint64(len(body)-4) != 4*uint64(n) {
		return nil, fmt.Errorf("command reply with %d ids in %d bytes: %w", n, len(body)-4, errMalformed)
	}
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(binary.LittleEndian.Uint32(body[4+4*i:]))
	}
	return ids, nil
}

// appendCounters appends name/value pairs.
func appendCounters(b []byte, names []string, values []uint64) []byte {
	for i, n := range names {
		b = append(b, byte(len(n)))
		b = append(b, n...)
		b = binary.LittleEndian.AppendUint64(b, values[i])
	}
	return b
}

// parseCounters parses name/value pairs, in order.
func parseCounters(b []byte) ([]Counter, error) {
	var out []Counter
	for len(b) > 0 {
		n := int(b[0])
		if len(b) < 1+n+8 {
			return nil, fmt.Errorf("counter of %d bytes: %w", len(b), errMalformed)
		}
		out = append(out, Counter{Name: string(b[1 : 1+n]), Value: binary.LittleEndian.Uint64(b[1+n:])})
		b = b[1+n+8:]
	}
	return slices.Clip(out), nil
}

// Counter is one named counter of a device.
type Counter struct {
	Name  string
	Value uint64
}
