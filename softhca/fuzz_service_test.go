//go:build linux

package softhca

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/internal/mlx4abi"
	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
)

// FuzzServiceMessage feeds arbitrary messages to the device service: to
// the protocol's decoders, whose results must encode back to the same
// bytes, and to a session, one message after another, as its connection
// would deliver them (session.request, what session.run does with each
// message it reads).
//
// The session's client is a sleep(1) child process: the device reads and
// writes its memory with process_vm_readv/writev, as it does a real
// client's, so that no address in a fuzzed command reaches the memory of
// the fuzzing process itself.
//
// An input is a script of up to svcMaxRecords records: a flags byte, a
// 16-bit little-endian length and that many bytes, the message. The flags:
const (
	svcHello    = 1 << 0 // the message is replaced by a hello that passes the probe
	svcFDs      = 3 << 1 // 0 to 3 memfds go with the message
	svcBigFD    = 1 << 3 // the memfds are of 64 KiB, not 4 KiB
	svcTrunc    = 1 << 4 // the message came with MSG_TRUNC
	svcCTrunc   = 1 << 5 // ... with MSG_CTRUNC
	svcStranger = 1 << 6 // the client is another user
	svcRelocate = 1 << 7 // a command's response pointer is an offset in writable memory of the client
)

const svcMaxRecords = 16

// svcWorld is the device, the client process and what each input is
// checked against.
type svcWorld struct {
	d      *Device
	child  *exec.Cmd
	pid    int
	probe  uint64   // where the child's memory holds nonce
	nonce  [16]byte //
	rw     uint64   // writable memory of the child
	objs   Objects
	fds    int // descriptors open between inputs
	broken bool
}

func newSvcWorld(tb testing.TB) *svcWorld {
	d, err := New(context.Background(), Config{Name: "fuzzsvc0", Addr: netip.MustParseAddr("127.7.2.1"), SpinIdle: -1})
	if err != nil {
		tb.Fatal(err)
	}
	w := &svcWorld{d: d}
	if err := w.startChild(); err != nil {
		w.close()
		tb.Skipf("no client process: %v", err)
	}
	// Once to open what the net package opens on first use.
	s := w.session(tb)
	s.close()
	w.objs = d.Objects()
	w.fds = openFDs(tb)
	return w
}

func (w *svcWorld) close() {
	if w.child != nil {
		w.child.Process.Kill()
		w.child.Wait()
	}
	w.d.Close()
}

// startChild starts the client process and finds in its memory a probe
// and nonce for hellos, and writable memory for command responses.
func (w *svcWorld) startChild() error {
	if w.child != nil {
		w.child.Process.Kill()
		w.child.Wait()
		w.child = nil
	}
	path, err := exec.LookPath("sleep")
	if err != nil {
		return err
	}
	c := exec.Command(path, "3600")
	if err := c.Start(); err != nil {
		return err
	}
	w.child, w.pid = c, c.Process.Pid
	// Wait until it sleeps: while the dynamic loader runs, mappings
	// change (RELRO makes writable memory read-only).
	for i := 0; ; i++ {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(w.pid) + "/syscall")
		if err != nil {
			return err
		}
		nr, _, _ := strings.Cut(string(b), " ")
		if nr == strconv.Itoa(syscall.SYS_CLOCK_NANOSLEEP) || nr == strconv.Itoa(syscall.SYS_NANOSLEEP) {
			break
		}
		if i == 5000 {
			return errors.New("sleep(1) does not sleep")
		}
		time.Sleep(time.Millisecond)
	}
	maps, err := os.ReadFile("/proc/" + strconv.Itoa(w.pid) + "/maps")
	if err != nil {
		return err
	}
	w.probe, w.rw = 0, 0
	for sc := bufio.NewScanner(bytes.NewReader(maps)); sc.Scan(); {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if w.probe == 0 && strings.HasPrefix(f[1], "r") {
			w.probe = a
		}
		if w.rw == 0 && strings.HasPrefix(f[1], "rw") && b-a >= 4096 {
			w.rw = a
		}
	}
	if w.probe == 0 || w.rw == 0 {
		return errors.New("no readable and writable memory in the client")
	}
	return unix.ProcessVMRead(w.pid, w.nonce[:], w.probe)
}

// childAlive reports whether the client process runs (and is not a zombie).
func (w *svcWorld) childAlive() bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(w.pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// openFDs counts the process's open descriptors.
func openFDs(tb testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatal(err)
	}
	return len(ents)
}

// session makes a session of the device, on a connection whose other end
// is closed: requests come through session.request, not the socket.
func (w *svcWorld) session(tb testing.TB) *session {
	fds, err := unix.Socketpair(unix.SOCK_SEQPACKET)
	if err != nil {
		tb.Fatal(err)
	}
	unix.Close(fds[1])
	f := os.NewFile(uintptr(fds[0]), "fuzz-session")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		tb.Fatal(err)
	}
	return &session{d: w.d, conn: c.(*net.UnixConn),
		cred: unix.Cred{PID: w.pid, UID: unix.Geteuid(), GID: os.Getegid()}}
}

func (w *svcWorld) goodHello() []byte {
	h := hello{version: protoVersion, probe: w.probe, nonce: w.nonce}
	return h.append(nil)
}

// memfds makes n memfds of size bytes, for a message to pass.
func memfds(tb testing.TB, n, size int) []int {
	var fds []int
	for range n {
		fd, b, err := unix.Memfd("fuzz-queue", size)
		if err != nil {
			tb.Fatal(err)
		}
		unix.Munmap(b)
		fds = append(fds, fd)
	}
	return fds
}

func fdOpen(fd int) bool {
	_, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
	return e == 0
}

// run plays one input through a new session, which it then closes: the
// device must be left with the objects and descriptors it had.
func (w *svcWorld) run(t testing.TB, s []byte) {
	w.broken = true
	if w.child.ProcessState != nil {
		t.Fatal("the client process is gone")
	}
	if !w.childAlive() { // a fuzzed command wrote where sleep(1) needed it
		if err := w.startChild(); err != nil {
			t.Fatal(err)
		}
	}
	checkDecoders(t, s)
	sess := w.session(t)
	for k := 0; k < svcMaxRecords && len(s) >= 3; k++ {
		f, n := s[0], int(binary.LittleEndian.Uint16(s[1:]))
		s = s[3:]
		n = min(n, len(s))
		msg := slices.Clone(s[:n])
		s = s[n:]
		if f&svcHello != 0 {
			msg = w.goodHello()
		}
		checkDecoders(t, msg)
		w.request(t, sess, f, msg)
	}
	sess.close()
	if o := w.d.Objects(); o != w.objs {
		t.Fatalf("objects after the session closed: %+v, before: %+v", o, w.objs)
	}
	// A session must leave no descriptor behind. The count may go down:
	// the garbage collector closes files that earlier tests of the
	// package dropped whenever it runs, which is then the new baseline.
	if n := openFDs(t); n > w.fds {
		t.Fatalf("%d descriptors open after the session closed, %d before", n, w.fds)
	} else {
		w.fds = n
	}
	w.broken = false
}

// request sends one message to the session and checks the answer.
func (w *svcWorld) request(t testing.TB, s *session, f byte, msg []byte) {
	t.Helper()
	fds := memfds(t, int(f&svcFDs)>>1, map[bool]int{false: 4096, true: 64 << 10}[f&svcBigFD != 0])
	flags := 0
	if f&svcTrunc != 0 {
		flags |= syscall.MSG_TRUNC
	}
	if f&svcCTrunc != 0 {
		flags |= syscall.MSG_CTRUNC
	}
	s.cred.UID = unix.Geteuid()
	if f&svcStranger != 0 {
		s.cred.UID++
	}
	var t0 msgType
	if len(msg) >= 4 {
		t0 = msgType(binary.LittleEndian.Uint32(msg))
	}
	body := msg[min(4, len(msg)):]
	if f&svcRelocate != 0 && t0 == msgCommand && len(body) >= 16 {
		off := binary.NativeEndian.Uint64(body[8:]) & 0xfff
		binary.NativeEndian.PutUint64(body[8:], w.rw+off)
	}
	// What must be refused as malformed, and counted.
	helloDone := s.c != nil
	var malformed string
	switch {
	case flags != 0:
		malformed = "truncated"
	case len(msg) < 4:
		malformed = "short"
	case s.cred.UID != unix.Geteuid() && s.cred.UID != 0:
		malformed = "another user's"
	case len(fds) > 0 && t0 != msgAddQueue:
		malformed = "with descriptors"
	case t0 < msgHello || t0 > msgCounters:
		malformed = "unknown"
	case t0 == msgHello && (helloDone || len(body) != 32 || binary.LittleEndian.Uint32(body) != protoVersion):
		malformed = "bad hello"
	case (t0 == msgCommand || t0 == msgAddQueue || t0 == msgRemoveQueue) && !helloDone:
		malformed = "before hello"
	case t0 == msgAddQueue && (len(body) != 16 || len(fds) != 1):
		malformed = "bad addQueue"
	case t0 == msgRemoveQueue && len(body) != 8:
		malformed = "bad removeQueue"
	}
	bad0 := w.d.counters.BadMessages.Load()
	a := s.request(msg, unix.Rights(fds...), flags, nil)
	bad := w.d.counters.BadMessages.Load() - bad0
	defer func() {
		for _, fd := range a.close { // what run does once the reply is sent
			unix.Close(fd)
		}
	}()
	r := a.reply
	if len(r) < 8 || len(r) > maxMessage {
		t.Fatalf("%v request %x: reply of %d bytes", t0, msg, len(r))
	}
	rt, errno := msgType(binary.LittleEndian.Uint32(r)), unix.Errno(binary.LittleEndian.Uint32(r[4:]))
	if flags == 0 && len(msg) >= 4 && rt != t0 || (flags != 0 || len(msg) < 4) && rt != 0 {
		t.Fatalf("%v request %x: reply answers %v", t0, msg, rt)
	}
	switch {
	case malformed != "" && (errno == 0 || bad != 1):
		t.Fatalf("%s %v request %x: errno %d, counted %d times", malformed, t0, msg, errno, bad)
	case errno == 0 && bad != 0 || bad > 1:
		t.Fatalf("%v request %x succeeded, counted %d times as bad", t0, msg, bad)
	case errno != 0 && bad == 0 && !(helloDone && (t0 == msgCommand || t0 == msgRemoveQueue && errno == unix.EBUSY)):
		// Only a command's own failure and a queue in use are the
		// client's business rather than a bad message.
		t.Fatalf("%v request %x failed (%v) without being counted", t0, msg, errno)
	}
	for _, fd := range a.pass {
		if !fdOpen(fd) {
			t.Fatalf("%v reply passes descriptor %d, which is closed", t0, fd)
		}
	}
	rbody, err := parseReply(r, rt)
	if errno != 0 {
		if !errors.Is(err, errno) || len(a.pass) > 0 {
			t.Fatalf("%v reply with errno %d: %v, passing %d descriptors", t0, errno, err, len(a.pass))
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	switch rt {
	case msgHello, msgInfo:
		i, err := parseDeviceInfo(rbody)
		if err != nil || i != *w.d.info() {
			t.Fatalf("%v reply %x: %+v, %v", rt, rbody, i, err)
		}
		if rt == msgHello && (len(a.pass) != 2 || a.pass[1] != s.kick || !slices.Equal(a.close, a.pass[:1])) {
			t.Fatalf("hello passes %v and closes %v", a.pass, a.close)
		}
	case msgCounters:
		cs, err := parseCounters(rbody)
		names, _ := w.d.counterValues()
		if err != nil || len(cs) != len(names) {
			t.Fatalf("counters reply: %d counters, %v", len(cs), err)
		}
		for i, c := range cs {
			if c.Name != names[i] {
				t.Fatalf("counter %d is %q, want %q", i, c.Name, names[i])
			}
		}
	case msgCommand:
		ids, err := parseIDs(rbody)
		if err != nil || len(ids) != len(a.pass) || !slices.Equal(a.pass, a.close) {
			t.Fatalf("command reply: ids %v (%v), passes %v, closes %v", ids, err, a.pass, a.close)
		}
	default:
		if len(rbody) != 0 || len(a.pass) != 0 {
			t.Fatalf("%v reply %x, passing %v", rt, rbody, a.pass)
		}
	}
}

// checkDecoders runs b through every decoder of the protocol: none may
// panic, each fails only with errMalformed, and what decodes encodes back
// to the same bytes.
func checkDecoders(t testing.TB, b []byte) {
	t.Helper()
	malformed := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, errMalformed) {
			t.Fatalf("%s of %x: %v, not errMalformed", what, b, err)
		}
	}
	typ, body, err := splitRequest(b)
	if err != nil {
		malformed("splitRequest", err)
		if len(b) >= 4 {
			t.Fatalf("splitRequest refused %x", b)
		}
	} else if !bytes.Equal(append(appendRequest(nil, typ), body...), b) {
		t.Fatalf("request %x splits into %v and %x", b, typ, body)
	}
	if h, err := parseHello(b); err != nil {
		malformed("parseHello", err)
	} else {
		want := append(binary.LittleEndian.AppendUint32(nil, uint32(msgHello)), b...)
		clear(want[8:12]) // the word after the version is 0
		if got := h.append(nil); !bytes.Equal(got, want) {
			t.Fatalf("hello %x decodes to %+v, which encodes to %x", b, h, got)
		}
	}
	for n := range 3 {
		if ws, err := parseWords(msgAddQueue, b, n); err != nil {
			malformed("parseWords", err)
		} else if !bytes.Equal(appendRequest(nil, msgAddQueue, ws...)[4:], b) {
			t.Fatalf("words %x decode to %v", b, ws)
		}
	}
	if i, err := parseDeviceInfo(b); err != nil {
		malformed("parseDeviceInfo", err)
	} else if len(i.name) > maxNameLen || !bytes.Equal(i.append(nil), b) {
		t.Fatalf("device info %x decodes to %+v", b, i)
	}
	if ids, err := parseIDs(b); err != nil {
		malformed("parseIDs", err)
	} else if !bytes.Equal(appendIDs(nil, ids), b) {
		t.Fatalf("ids %x decode to %v", b, ids)
	}
	if cs, err := parseCounters(b); err != nil {
		malformed("parseCounters", err)
	} else {
		var names []string
		var values []uint64
		for _, c := range cs {
			names, values = append(names, c.Name), append(values, c.Value)
		}
		if !bytes.Equal(appendCounters(nil, names, values), b) {
			t.Fatalf("counters %x decode to %v", b, cs)
		}
	}
	if len(b) >= 8 {
		rt := msgType(binary.LittleEndian.Uint32(b))
		errno := unix.Errno(binary.LittleEndian.Uint32(b[4:]))
		rb, err := parseReply(b, rt)
		switch {
		case errno == 0 && (err != nil || !bytes.Equal(append(appendReply(nil, rt, nil), rb...), b)):
			t.Fatalf("reply %x decodes to %x, %v", b, rb, err)
		case errno != 0 && (!errors.Is(err, errno) || rb != nil):
			t.Fatalf("reply %x with errno %d decodes to %v", b, errno, err)
		}
		if _, err := parseReply(b, rt+1); err == nil || !errors.Is(err, errMalformed) {
			t.Fatalf("reply %x to %v taken for a reply to %v: %v", b, rt, rt+1, err)
		}
	} else if _, err := parseReply(b, 0); err == nil {
		t.Fatalf("reply of %d bytes accepted", len(b))
	}
	// And the other way: values made of b encode to what decodes to
	// them.
	var i deviceInfo
	if len(b) >= 28 {
		i.guid = binary.LittleEndian.Uint64(b)
		copy(i.gid[:], b[8:24])
		i.mtu = binary.LittleEndian.Uint32(b[24:])
		i.name = string(b[28:min(len(b), 28+maxNameLen)])
	}
	if got, err := parseDeviceInfo(i.append(nil)); err != nil || got != i {
		t.Fatalf("device info %+v decodes to %+v, %v", i, got, err)
	}
	var h hello
	if len(b) >= 28 {
		h.version = binary.LittleEndian.Uint32(b)
		h.probe = binary.LittleEndian.Uint64(b[4:])
		copy(h.nonce[:], b[12:])
	}
	if tp, hb, err := splitRequest(h.append(nil)); err != nil || tp != msgHello {
		t.Fatalf("hello %+v splits into %v, %v", h, tp, err)
	} else if got, err := parseHello(hb); err != nil || got != h {
		t.Fatalf("hello %+v decodes to %+v, %v", h, got, err)
	}
	var names []string
	var values []uint64
	var ids []int32
	for rest := b; len(rest) > 0; {
		n := min(int(rest[0]), len(rest)-1)
		names, values = append(names, string(rest[1:1+n])), append(values, uint64(n)*0x0101010101)
		ids = append(ids, int32(n)-128)
		rest = rest[1+n:]
	}
	if cs, err := parseCounters(appendCounters(nil, names, values)); err != nil || len(cs) != len(names) {
		t.Fatalf("counters %q decode to %v, %v", names, cs, err)
	} else {
		for k, c := range cs {
			if c.Name != names[k] || c.Value != values[k] {
				t.Fatalf("counter %q=%d decodes to %+v", names[k], values[k], c)
			}
		}
	}
	if got, err := parseIDs(appendIDs(nil, ids)); err != nil || !slices.Equal(got, ids) {
		t.Fatalf("ids %v decode to %v, %v", ids, got, err)
	}
	errno := unix.Errno(len(b)%200 + 1)
	msg := string(b)
	sent := unix.Error(errno, msg).Error()
	// The message is cut at 1024 bytes, and the errno's text it ends with
	// is not repeated.
	want := unix.Error(errno, strings.TrimSuffix(sent[:min(len(sent), 1024)], ": "+errno.Error())).Error()
	if _, err := parseReply(appendReply(nil, msgCommand, unix.Error(errno, msg)), msgCommand); !errors.Is(err, errno) || err.Error() != want {
		t.Fatalf("error %v of %q comes back as %v", errno, msg, err)
	}
}

// svcScript builds inputs.
type svcScript []byte

func (s *svcScript) add(flags byte, msg []byte) *svcScript {
	*s = append(*s, flags, byte(len(msg)), byte(len(msg)>>8))
	*s = append(*s, msg...)
	return s
}

// svcSeeds are messages of every kind, good and bad, and a session that
// goes as deep as a client's: hello, queue memory, a context, a CQ in the
// queue memory, which then cannot be removed.
func svcSeeds() []svcScript {
	const qAddr = 0x10000
	req := func(t msgType, words ...uint64) []byte { return appendRequest(nil, t, words...) }
	cmd := func(b []byte) []byte { return append(req(msgCommand), b...) }
	var out []svcScript
	var s svcScript
	s.add(svcHello, nil).add(0, req(msgInfo)).add(0, req(msgCounters))
	s.add(1<<1|svcBigFD, req(msgAddQueue, qAddr, 64<<10))
	s.add(svcRelocate, cmd(frame(uverbs.CmdGetContext, &uverbs.Cmd[uverbs.GetContext]{}, 32)))
	s.add(svcRelocate, cmd(frame(uverbs.CmdCreateCQ, &mlx4abi.CreateCQ{
		Core: uverbs.CreateCQ{CQE: 63, CompChannel: -1}, Drv: mlx4abi.IBCreateCQ{BufAddr: qAddr, DBAddr: qAddr + 0x8000}}, 16)))
	s.add(svcRelocate, cmd(frame(uverbs.CmdCreateCompChannel, &uverbs.Cmd[uverbs.CreateCompChannel]{}, 4)))
	s.add(0, req(msgRemoveQueue, qAddr))      // in use
	s.add(0, req(msgRemoveQueue, qAddr+4096)) // no such queue
	s.add(svcHello, nil)                      // a second hello
	out = append(out, s)
	s = nil
	s.add(svcHello, nil).add(1<<1, req(msgAddQueue, qAddr, 4096)).add(0, req(msgRemoveQueue, qAddr))
	s.add(1<<1, req(msgAddQueue, qAddr+1, 4096)).add(2<<1, req(msgAddQueue, qAddr, 4096))
	s.add(1<<1, req(msgAddQueue, qAddr, 64<<10)).add(0, req(msgAddQueue, qAddr, 4096))
	s.add(1<<1, req(msgAddQueue, qAddr, 4096)).add(1<<1, req(msgAddQueue, qAddr, 4096))
	out = append(out, s)
	one := func(flags byte, msg []byte) {
		var s svcScript
		s.add(flags, msg)
		out = append(out, s)
	}
	h := hello{version: protoVersion, probe: 0x1000}
	one(0, h.append(nil))
	h.version = 2
	one(0, h.append(nil))
	one(0, h.append(nil)[:20])
	one(0, req(msgInfo))
	one(0, req(msgCounters))
	one(1<<1, req(msgInfo))
	one(svcTrunc, req(msgInfo))
	one(svcCTrunc, req(msgCounters))
	one(svcStranger, req(msgCounters))
	one(0, req(msgCommand))
	one(0, req(99))
	one(0, []byte{1, 0})
	one(0, nil)
	return out
}

func FuzzServiceMessage(f *testing.F) {
	w := newSvcWorld(f)
	f.Cleanup(func() { w.close() })
	for _, s := range svcSeeds() {
		f.Add([]byte(s))
	}
	i := deviceInfo{guid: 7, mtu: 4096, name: "soft0"}
	f.Add(appendReply(nil, msgInfo, nil))
	f.Add(i.append(nil))
	f.Add(appendCounters(nil, []string{"port_rcv_packets", "x"}, []uint64{1, 2}))
	f.Add(appendIDs(nil, []int32{3, -1}))
	f.Add(appendReply(nil, msgCommand, unix.Error(unix.EINVAL, "no")))
	f.Fuzz(func(t *testing.T, s []byte) {
		if w.broken {
			w = newSvcWorld(t)
		}
		w.run(t, s)
	})
}

// TestServiceSeeds checks that the deep seed goes where it is meant to: a
// CQ created through the session in queue memory it added.
func TestServiceSeeds(t *testing.T) {
	w := newSvcWorld(t)
	defer w.close()
	s := svcSeeds()[0]
	sess := w.session(t)
	var cqs int
	for len(s) >= 3 {
		f, n := s[0], int(binary.LittleEndian.Uint16(s[1:]))
		msg := slices.Clone(s[3 : 3+n])
		if f&svcHello != 0 {
			msg = w.goodHello()
		}
		w.request(t, sess, f, msg)
		cqs = max(cqs, w.d.Objects().CQs)
		s = s[3+n:]
	}
	sess.close()
	if cqs != 1 {
		t.Fatalf("the seed made %d CQs, want 1", cqs)
	}
}
