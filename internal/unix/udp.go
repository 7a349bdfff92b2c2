//go:build linux

package unix

import (
	"encoding/binary"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The UDP socket of a RoCEv2 port: raw sendmsg and recvmsg without an
// allocation or an extra system call per datagram (x/sys's Recvfrom asks
// the socket's protocol on every call), with UDP GSO on send and GRO on
// receive, which move up to 64 KiB of equal-sized datagrams per call.

// UDPSocket opens a non-blocking, close-on-exec UDP socket bound to addr,
// with GRO on: the kernel may hand several datagrams of one flow to one
// receive, with their size in a control message.
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
// the ICRC covers), and socket buffers of size bytes (forced past the
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
	fd  int
	sa  unix.RawSockaddrAny
	oob [64]byte
	iov unix.Iovec
	msg unix.Msghdr
}

// NewUDPReceiver returns a receiver on fd.
func NewUDPReceiver(fd int) *UDPReceiver { return &UDPReceiver{fd: fd} }

// Recv receives without waiting into b: one datagram, or with GRO several
// of seg bytes each (the last may be shorter; seg is 0 for one datagram).
// It fails with EAGAIN when nothing is there.
func (r *UDPReceiver) Recv(b []byte) (n, seg int, from netip.AddrPort, err error) {
	r.iov.Base = &b[0]
	r.iov.SetLen(len(b))
	r.msg = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&r.sa)), Namelen: unix.SizeofSockaddrAny, Iov: &r.iov, Iovlen: 1,
		Control: &r.oob[0]}
	r.msg.SetControllen(len(r.oob))
	for {
		m, _, e := unix.Syscall(unix.SYS_RECVMSG, uintptr(r.fd), uintptr(unsafe.Pointer(&r.msg)), unix.MSG_DONTWAIT)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, 0, netip.AddrPort{}, WrapErrno(e)
		}
		n = int(m)
		break
	}
	if r.msg.Flags&unix.MSG_TRUNC != 0 {
		return 0, 0, netip.AddrPort{}, Error(EMSGSIZE, "datagram larger than the buffer")
	}
	return n, r.gsoSize(), r.from(), nil
}

// gsoSize finds the UDP_GRO control message.
func (r *UDPReceiver) gsoSize() int {
	oob := r.oob[:r.msg.Controllen]
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return 0
		}
		if h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && l >= unix.CmsgLen(4) {
			return int(binary.NativeEndian.Uint32(oob[unix.CmsgLen(0):]))
		}
		oob = oob[min(len(oob), unix.CmsgSpace(l-unix.CmsgLen(0))):]
	}
	return 0
}

func (r *UDPReceiver) from() netip.AddrPort {
	switch r.sa.Addr.Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&r.sa))
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), binary.BigEndian.Uint16(p[:]))
	case unix.AF_INET6:
		sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(&r.sa))
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), binary.BigEndian.Uint16(p[:]))
	}
	return netip.AddrPort{}
}

// Readable reports whether fd has data to read now.
func Readable(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, 0)
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
