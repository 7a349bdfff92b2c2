//go:build linux

package softhca

import (
	"errors"
	"math"
	"net"
	"os"
	"syscall"

	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/internal/uverbs"
)

// session serves one connection of a device service: one client in
// another process. Its goroutine owns everything here.
type session struct {
	d    *Device
	conn *net.UnixConn

	kickFile *os.File // the eventfd the client wakes the engine with; nil until hello
	kick     int      // its descriptor, passed to the client

	cred  unix.Cred
	c     *Client // nil until hello
	mem   *remoteMemory
	bells *bellSource
	ring  []byte // the device's mapping of the bell ring
}

// answer is what a request gets: the reply, the descriptors passed with
// it, and those of them the device closes once they are passed.
type answer struct {
	reply []byte
	pass  []int
	close []int // the device's descriptors to close once passed
}

// run answers requests until the client disconnects or the service stops,
// then destroys what the client left.
func (s *session) run() {
	defer s.close()
	var err error
	if s.cred, err = unix.PeerCred(s.conn); err != nil {
		s.d.log.Warn("client credentials", "err", err)
		return
	}
	// The session moves data to and from the process that connected, by
	// its PID. When that process exits, a process it handed the
	// connection to (a child, say) would keep the session, and a new
	// process that got the PID would get its data: the session ends.
	stop, err := unix.WatchExit(s.cred.PID, func() {
		s.d.log.Debug("client process exited; its connection ends", "pid", s.cred.PID)
		s.conn.Close()
	})
	switch {
	case errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM):
		// A kernel before 5.3, or a seccomp filter: no watch.
		s.d.log.Warn("cannot watch the client process; its session lasts as long as its connection", "pid", s.cred.PID, "err", err)
	case err != nil:
		s.d.log.Warn("client process", "pid", s.cred.PID, "err", err)
		return
	default:
		defer stop()
	}
	buf := make([]byte, maxMessage)
	oob := make([]byte, unix.RightsSpace(4))
	var reply []byte
	for {
		n, oobn, flags, _, err := s.conn.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 && oobn == 0 {
			return // the client is gone (or the service stops)
		}
		a := s.request(buf[:n], oob[:oobn], flags, reply[:0])
		reply = a.reply
		_, _, werr := s.conn.WriteMsgUnix(a.reply, unix.Rights(a.pass...), nil)
		for _, fd := range a.close {
			unix.Close(fd)
		}
		if werr != nil {
			return
		}
	}
}

// request answers one message: its bytes, the control message that came
// with it and the flags it was received with. It takes the descriptors the
// control message passes. A message that fails is counted (BadMessages)
// and answered with the errno.
func (s *session) request(msg, oob []byte, flags int, reply []byte) answer {
	fds, ferr := unix.ParseRights(oob)
	var a answer
	var t msgType
	var err error
	switch {
	case flags&(syscall.MSG_TRUNC|syscall.MSG_CTRUNC) != 0:
		err = unix.Errorf(unix.EMSGSIZE, "message larger than %d bytes or with too many descriptors", maxMessage)
	case ferr != nil:
		err = ferr
	default:
		var body []byte
		if t, body, err = splitRequest(msg); err == nil {
			a, err = s.handle(t, body, fds, reply)
			fds = nil // handle took them
		}
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	if err != nil {
		s.d.counters.BadMessages.Add(1)
		if s.d.debug {
			s.d.log.Debug("service request failed", "pid", s.cred.PID, "request", t, "err", err)
		}
		a = answer{reply: appendReply(reply, t, err)}
	}
	return a
}

// handle runs one request, taking ownership of fds.
func (s *session) handle(t msgType, body []byte, fds []int, reply []byte) (answer, error) {
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	if t != msgAddQueue && t != msgAddRegion && len(fds) > 0 && !(t == msgCommand && len(fds) == 1 && isOpenXRCD(body)) {
		closeAll()
		return answer{}, unix.Errorf(unix.EINVAL, "%v passes %d descriptors", t, len(fds))
	}
	if s.cred.UID != unix.Geteuid() && s.cred.UID != 0 {
		closeAll()
		return answer{}, unix.Errorf(unix.EACCES, "user %d may not use device %s, which runs as user %d", s.cred.UID, s.d.name, unix.Geteuid())
	}
	if (t == msgInfo || t == msgCounters) && len(body) != 0 {
		return answer{}, unix.Errorf(unix.EINVAL, "%v with a body of %d bytes", t, len(body))
	}
	switch t {
	case msgInfo:
		return answer{reply: s.d.info().append(appendReply(reply, t, nil))}, nil
	case msgCounters:
		names, values := s.d.counterValues()
		return answer{reply: appendCounters(appendReply(reply, t, nil), names, values)}, nil
	case msgHello:
		ringFD, err := s.hello(body)
		if err != nil {
			return answer{}, err
		}
		// Once mapped, the ring needs no descriptor in the device; the
		// eventfd stays the session's.
		return answer{reply: s.d.info().append(appendReply(reply, t, nil)),
			pass: []int{ringFD, s.kick}, close: []int{ringFD}}, nil
	}
	if s.c == nil {
		closeAll()
		return answer{}, unix.Errorf(unix.EPROTO, "%v before hello", t)
	}
	switch t {
	case msgCommand:
		// The file OPEN_XRCD names, when the client passes it, stands in
		// for the descriptor number in the command.
		s.d.mu.Lock()
		s.c.passed = fds
		s.d.mu.Unlock()
		_, err := s.c.Write(body)
		s.d.mu.Lock()
		s.c.passed = nil
		s.d.mu.Unlock()
		closeAll()
		handed := s.c.takeHandedOut()
		out := make([]int, len(handed))
		ids := make([]int32, len(handed))
		for i, h := range handed {
			out[i], ids[i] = h.fd, h.id
		}
		if err != nil {
			for _, fd := range out {
				unix.Close(fd)
			}
			// A failed command is the client's business, not a bad
			// message: it gets the errno as from write(2).
			return answer{reply: appendReply(reply, t, err)}, nil
		}
		return answer{reply: appendIDs(appendReply(reply, t, nil), ids), pass: out, close: out}, nil
	case msgAddQueue:
		return s.addQueue(t, body, fds, reply)
	case msgAddRegion:
		return s.addRegion(t, body, fds, reply)
	case msgRemoveQueue:
		return s.removeQueue(t, body, reply)
	}
	return answer{}, unix.Errorf(unix.EINVAL, "unknown request %v", t)
}

// hello makes the connection a client of the device. It returns the
// descriptor of the bell ring's memory, for the client.
func (s *session) hello(body []byte) (int, error) {
	if s.c != nil {
		return -1, unix.Error(unix.EPROTO, "second hello")
	}
	h, err := parseHello(body)
	if err != nil {
		return -1, unix.Errorf(unix.EINVAL, "%v", err)
	}
	if h.version != protoVersion {
		return -1, unix.Errorf(unix.EPROTO, "client speaks version %d of the device protocol, the device %d", h.version, protoVersion)
	}
	mem := &remoteMemory{processMemory: processMemory{s.cred.PID}, maps: s.d.maps}
	if err := mem.probe(h.probe, h.nonce[:]); err != nil {
		return -1, err
	}
	if err := s.d.maps.take(bellSize); err != nil {
		return -1, err
	}
	fd, ring, err := unix.Memfd("xrc-bells", bellSize)
	if err != nil {
		s.d.maps.give(bellSize)
		return -1, err
	}
	kickFile, kick, err := s.d.startKick()
	if err != nil {
		unix.Close(fd)
		s.d.maps.unmap(ring)
		return -1, err
	}
	c, err := s.d.connect(mem)
	if err != nil {
		kickFile.Close()
		unix.Close(fd)
		s.d.maps.unmap(ring)
		return -1, unix.Errorf(unix.ENODEV, "%v", err)
	}
	s.d.mu.Lock()
	c.remote = true // its descriptor numbers are not this process's
	s.d.mu.Unlock()
	s.c, s.mem, s.ring, s.kickFile, s.kick = c, mem, ring, kickFile, kick
	s.bells = &bellSource{c: c, r: newBellRing(ring)}
	s.d.eng.addRing(s.bells)
	s.d.log.Debug("client connected", "pid", s.cred.PID, "uid", s.cred.UID)
	return fd, nil
}

// mapPassed maps the memfd memory a request (addr u64, len u64, one fd)
// passes, which the client maps at addr. It closes the descriptors.
func mapPassed(t msgType, body []byte, fds []int, maps *mapBudget) (addr uint64, b []byte, id fileID, err error) {
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	w, err := parseWords(t, body, 2)
	if err != nil {
		return 0, nil, fileID{}, unix.Errorf(unix.EINVAL, "%v", err)
	}
	addr, n := w[0], w[1]
	if len(fds) != 1 {
		return 0, nil, fileID{}, unix.Errorf(unix.EINVAL, "%v passes %d descriptors, not 1", t, len(fds))
	}
	page := uint64(unix.PageSize)
	if addr%page != 0 || addr == 0 || n == 0 || n%page != 0 || n > maxMRSize || addr > math.MaxUint64-n {
		return 0, nil, fileID{}, unix.Errorf(unix.EINVAL, "%v of %d bytes at %#x", t, n, addr)
	}
	// A file the client could shrink would kill the device with SIGBUS
	// at its next access.
	if err := unix.Sealed(fds[0]); err != nil {
		return 0, nil, fileID{}, unix.Errorf(unix.EINVAL, "%v: %v", t, err)
	}
	size, major, minor, ino, err := unix.FileStat(fds[0])
	id = fileID{major, minor, ino}
	if err != nil || uint64(size) < n {
		return 0, nil, fileID{}, unix.Errorf(unix.EINVAL, "%v: file of %d bytes for %d (%v)", t, size, n, err)
	}
	if err := maps.take(int(n)); err != nil {
		return 0, nil, fileID{}, err
	}
	if b, err = unix.MmapShared(fds[0], 0, int(n)); err != nil {
		maps.give(int(n))
	}
	return addr, b, id, err
}

// addQueue maps queue memory the client passes.
func (s *session) addQueue(t msgType, body []byte, fds []int, reply []byte) (answer, error) {
	addr, b, _, err := mapPassed(t, body, fds, s.d.maps)
	if err != nil {
		return answer{}, err
	}
	if len(b) > maxQueueBytes {
		s.d.maps.unmap(b)
		return answer{}, unix.Errorf(unix.EINVAL, "queue memory of %d bytes", len(b))
	}
	if !s.mem.addQueue(addr, b) {
		s.d.maps.unmap(b)
		return answer{}, unix.Errorf(unix.EINVAL, "queue memory at %#x overlaps queue memory", addr)
	}
	return answer{reply: appendReply(reply, t, nil)}, nil
}

// addRegion maps memory the client shares for its memory regions.
func (s *session) addRegion(t msgType, body []byte, fds []int, reply []byte) (answer, error) {
	addr, b, id, err := mapPassed(t, body, fds, s.d.maps)
	if err != nil {
		return answer{}, err
	}
	s.mem.addShared(addr, b, id)
	return answer{reply: appendReply(reply, t, nil)}, nil
}

// maxQueueBytes bounds one queue allocation.
const maxQueueBytes = 1 << 30

// removeQueue unmaps queue memory, unless a live object still uses it.
func (s *session) removeQueue(t msgType, body []byte, reply []byte) (answer, error) {
	w, err := parseWords(t, body, 1)
	if err != nil {
		return answer{}, unix.Errorf(unix.EINVAL, "%v", err)
	}
	d := s.d
	d.mu.Lock()
	sp, ok := s.mem.removeQueue(w[0])
	busy := ok && s.c.usesQueue(sp.b)
	if busy {
		s.mem.addQueue(sp.addr, sp.b)
	}
	d.mu.Unlock()
	switch {
	case !ok:
		return answer{}, unix.Errorf(unix.EINVAL, "no queue memory at %#x", w[0])
	case busy:
		return answer{reply: appendReply(reply, t, unix.Errorf(unix.EBUSY, "queue memory at %#x is in use", w[0]))}, nil
	}
	s.d.maps.unmap(sp.b)
	return answer{reply: appendReply(reply, t, nil)}, nil
}

// close destroys the client's objects and releases the session.
func (s *session) close() {
	if s.bells != nil {
		s.d.eng.removeRing(s.bells)
	}
	if s.c != nil {
		if err := s.c.Close(); err != nil {
			s.d.log.Warn("client cleanup", "pid", s.cred.PID, "err", err)
		}
		s.d.log.Debug("client disconnected", "pid", s.cred.PID)
	}
	if s.ring != nil {
		s.d.maps.unmap(s.ring)
	}
	if s.kickFile != nil {
		s.kickFile.Close()
	}
	s.conn.Close()
}

// info describes the device to clients.
func (d *Device) info() *deviceInfo {
	return &deviceInfo{guid: d.guid, gid: d.gid, mtu: uint32(d.mtu), name: d.name}
}

// counterValues lists the counters, the object counts, and the pieces of
// its clients' memory the device maps (client_mappings: queue and region
// memfds, bell rings; each is one of the process's vm.max_map_count).
func (d *Device) counterValues() ([]string, []uint64) {
	var names []string
	var values []uint64
	d.counters.Each(func(name, _ string, v uint64) {
		names = append(names, name)
		values = append(values, v)
	})
	o := d.Objects()
	for _, x := range []struct {
		n string
		v int
	}{{"clients", o.Clients}, {"pds", o.PDs}, {"mrs", o.MRs}, {"cqs", o.CQs}, {"srqs", o.SRQs}, {"qps", o.QPs}, {"xrcds", o.XRCDs}} {
		names = append(names, "objects_"+x.n)
		values = append(values, uint64(x.v))
	}
	return append(names, "client_mappings"), append(values, uint64(d.maps.n.Load()))
}

// isOpenXRCD reports whether a command message's body is an OPEN_XRCD
// command, the one command that comes with a file: XRC domains are shared
// by the files processes open, and a client in another process proves it
// has the file open by passing it (SCM_RIGHTS), as the kernel looks the
// descriptor up in the caller's own table. A device that took a device and
// inode number instead would let any client join any domain by guessing.
func isOpenXRCD(body []byte) bool {
	hdr, ok := uverbs.Decode[uverbs.CmdHdr](body)
	return ok && hdr.Command == uverbs.CmdOpenXRCD
}
