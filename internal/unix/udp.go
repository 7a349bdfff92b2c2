//go:build linux

package unix

import (
	"encoding/binary"
	"net/netip"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The UDP socket of a RoCEv2 port: raw sendmsg and recvmsg without an
// allocation or an extra system call per datagram (x/sys's Recvfrom asks
// the socket's protocol on every call), with UDP GSO on send and GRO on
// receive, which move up to 64 KiB of equal-sized datagrams per call.

// UDPSocket opens a non-blocking, close-on-exec UDP socket bound to addr,
// with GRO on: the kernel may hand several datagrams of one flow to one
// receive, with their size in a control message; and with receive
// timestamps on: each receive says when the kernel took its datagram in
// (Datagram.Stamp).
func UDPSocket(addr netip.AddrPort) (int, error) {
	family := unix.AF_INET
	if addr.Addr().Is6() && !addr.Addr().Is4In6() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.IPPROTO_UDP)
	if err != nil {
		return -1, Error(asErrno(err), "socket")
	}
	if err := unix.Bind(fd, sockaddr(addr)); err != nil {
		unix.Close(fd)
		return -1, Errorf(asErrno(err), "bind %v", addr)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_UDP, unix.UDP_GRO, 1); err != nil {
		unix.Close(fd)
		return -1, Error(asErrno(err), "set UDP_GRO")
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		unix.Close(fd)
		return -1, Error(asErrno(err), "set SO_TIMESTAMPNS")
	}
	return fd, nil
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	a := ap.Addr().Unmap()
	if a.Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}
}

// TuneRoCESocket prepares a UDP socket for RoCEv2: don't-fragment set (so
// that Linux gives unconnected IPv4 datagrams an identification of 0, which
// the ICRC covers), IPv6 datagrams with a UDP checksum of 0 taken (RoCEv2
// senders leave it 0, the ICRC covering the packet, and Linux drops such
// datagrams otherwise), and socket buffers of size bytes (forced past the
// system's maximum where the process may, asked for otherwise).
func TuneRoCESocket(s int, ipv4 bool, size int) error {
	var err error
	if ipv4 {
		err = unix.SetsockoptInt(s, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	} else {
		err = unix.SetsockoptInt(s, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
	}
	if err != nil {
		return Error(asErrno(err), "set don't-fragment")
	}
	if !ipv4 {
		if err := unix.SetsockoptInt(s, unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_RX, 1); err != nil {
			return Error(asErrno(err), "set UDP_NO_CHECK6_RX")
		}
	}
	for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
		if unix.SetsockoptInt(s, unix.SOL_SOCKET, o[0], size) != nil {
			unix.SetsockoptInt(s, unix.SOL_SOCKET, o[1], size)
		}
	}
	return nil
}

// MaxGSOSegments is the most datagrams one GSO send may carry.
const MaxGSOSegments = 64

// UDPSender sends datagrams on one socket. It is not safe for concurrent
// use.
type UDPSender struct {
	fd  int
	sa  unix.RawSockaddrInet6 // large enough for either family
	oob [24]byte              // one cmsg with a uint16: CmsgSpace(2) on 64-bit
	iov []unix.Iovec
	msg unix.Msghdr
}

// NewUDPSender returns a sender on fd.
func NewUDPSender(fd int) *UDPSender { return &UDPSender{fd: fd} }

// Send sends b to dst without waiting. If seg is not 0, b is several
// datagrams of seg bytes each (the last may be shorter) that the kernel
// splits (UDP GSO). A full socket buffer fails with EAGAIN.
func (s *UDPSender) Send(b []byte, seg int, dst netip.AddrPort) error {
	return s.SendVec([][]byte{b}, seg, dst)
}

// SendVec is Send of the concatenation of bufs, gathered by the kernel
// (sendmsg's iovec): with GSO, a datagram may span buffers.
func (s *UDPSender) SendVec(bufs [][]byte, seg int, dst netip.AddrPort) error {
	s.iov = s.iov[:0]
	total := 0
	for _, b := range bufs {
		if len(b) > 0 {
			s.iov = append(s.iov, unix.Iovec{Base: &b[0]})
			s.iov[len(s.iov)-1].SetLen(len(b))
			total += len(b)
		}
	}
	if total == 0 {
		return nil
	}
	n := s.setAddr(dst)
	s.msg = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&s.sa)), Namelen: uint32(n), Iov: &s.iov[0]}
	s.msg.SetIovlen(len(s.iov))
	if seg != 0 && seg < total {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&s.oob[0]))
		h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
		h.SetLen(unix.CmsgLen(2))
		binary.NativeEndian.PutUint16(s.oob[unix.CmsgLen(0):], uint16(seg))
		s.msg.Control = &s.oob[0]
		s.msg.SetControllen(unix.CmsgSpace(2))
	}
	for {
		_, _, e := unix.Syscall(unix.SYS_SENDMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&s.msg)), unix.MSG_DONTWAIT)
		switch e {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return Error(e, "sendmsg")
	}
}

func (s *UDPSender) setAddr(ap netip.AddrPort) int {
	a := ap.Addr().Unmap()
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], ap.Port())
	if a.Is4() {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&s.sa))
		*sa = unix.RawSockaddrInet4{Family: unix.AF_INET, Port: binary.NativeEndian.Uint16(port[:]), Addr: a.As4()}
		return unix.SizeofSockaddrInet4
	}
	s.sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Port: binary.NativeEndian.Uint16(port[:]), Addr: a.As16()}
	return unix.SizeofSockaddrInet6
}

// UDPReceiver receives datagrams from one socket. It is not safe for
// concurrent use.
type UDPReceiver struct {
	fd    int
	slots []batchSlot // by buffer of a RecvBatch
	mmsg  []unix.Mmsghdr
}

// NewUDPReceiver returns a receiver on fd.
func NewUDPReceiver(fd int) *UDPReceiver { return &UDPReceiver{fd: fd} }

// Datagram describes what RecvBatch put in one buffer: N bytes, one
// datagram, or with GRO several of Seg bytes each (the last may be
// shorter; Seg is 0 for one datagram), from From. Trunc reports a datagram
// larger than its buffer, cut short: the caller drops it. Stamp is when the
// kernel took the datagram in, in nanoseconds of the wall clock since the
// Unix epoch, or 0 if the socket does not say (UDPSocket's do).
type Datagram struct {
	N, Seg int
	From   netip.AddrPort
	Trunc  bool
	Stamp  int64
}

// batchSlot is the recvmmsg state of one buffer of RecvBatch.
type batchSlot struct {
	sa  unix.RawSockaddrAny
	oob [64]byte
	iov unix.Iovec
}

// RecvBatch receives without waiting into up to len(bufs) buffers, one
// datagram (or GRO batch) in each, with one recvmmsg system call, and
// describes them in ds, which must be as long as bufs. It returns how many
// buffers it filled; fewer than len(bufs) means the socket had nothing
// more when it looked, so that a caller need not ask again to find it
// empty. It fails with EAGAIN when nothing is there.
func (r *UDPReceiver) RecvBatch(bufs [][]byte, ds []Datagram) (int, error) {
	k := min(len(bufs), len(ds))
	if k == 0 {
		return 0, nil
	}
	if len(r.slots) < k {
		// The headers point into the slots, which stay put until they
		// grow: set them up once.
		r.slots = make([]batchSlot, k)
		r.mmsg = make([]unix.Mmsghdr, k)
		for i := range r.mmsg {
			sl := &r.slots[i]
			r.mmsg[i].Hdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&sl.sa)), Iov: &sl.iov, Iovlen: 1, Control: &sl.oob[0]}
		}
	}
	// Per call, only the buffers and what the kernel wrote back last time.
	for i, b := range bufs[:k] {
		sl, h := &r.slots[i], &r.mmsg[i].Hdr
		sl.iov.Base = &b[0]
		sl.iov.SetLen(len(b))
		h.Namelen, h.Flags = unix.SizeofSockaddrAny, 0
		h.SetControllen(len(sl.oob))
	}
	var m uintptr
	for {
		var e unix.Errno
		m, _, e = unix.Syscall6(unix.SYS_RECVMMSG, uintptr(r.fd), uintptr(unsafe.Pointer(&r.mmsg[0])), uintptr(k),
			unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, WrapErrno(e)
		}
		break
	}
	n := int(m)
	for i := range n {
		h, sl := &r.mmsg[i].Hdr, &r.slots[i]
		seg, stamp := controls(sl.oob[:h.Controllen])
		ds[i] = Datagram{N: int(r.mmsg[i].Len), Seg: seg, Stamp: stamp, From: sockaddrPort(&sl.sa),
			Trunc: h.Flags&unix.MSG_TRUNC != 0}
	}
	return n, nil
}

// controls finds the UDP_GRO segment size and the receive timestamp in
// the control messages oob (0 for either that is missing).
func controls(oob []byte) (seg int, stamp int64) {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return
		}
		data := oob[unix.CmsgLen(0):l]
		switch {
		case h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && len(data) >= 4:
			seg = int(binary.NativeEndian.Uint32(data))
		case h.Level == unix.SOL_SOCKET && h.Type == unix.SCM_TIMESTAMPNS && len(data) >= int(unsafe.Sizeof(unix.Timespec{})):
			ts := (*unix.Timespec)(unsafe.Pointer(&data[0]))
			stamp = ts.Nano()
		}
		oob = oob[min(len(oob), unix.CmsgSpace(l-unix.CmsgLen(0))):]
	}
	return
}

func sockaddrPort(rsa *unix.RawSockaddrAny) netip.AddrPort {
	switch rsa.Addr.Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(rsa))
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), binary.BigEndian.Uint16(p[:]))
	case unix.AF_INET6:
		sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(rsa))
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), binary.BigEndian.Uint16(p[:]))
	}
	return netip.AddrPort{}
}

// Readable reports whether fd has data to read now.
func Readable(fd int) bool { return ReadableWithin(fd, 0) }

// ReadableWithin reports whether fd has data to read within d (rounded
// down to milliseconds; poll(2) is not restarted after a signal).
func ReadableWithin(fd int, d time.Duration) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, int(d.Milliseconds()))
	return err == nil && n > 0 && p[0].Revents&unix.POLLIN != 0
}

// LocalPort returns the port a socket is bound to.
func LocalPort(fd int) (uint16, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return 0, Error(asErrno(err), "getsockname")
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return uint16(sa.Port), nil
	case *unix.SockaddrInet6:
		return uint16(sa.Port), nil
	}
	return 0, Error(EINVAL, "getsockname: not an IP socket")
}
