//go:build linux

package softhca

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/softhca/roce"
)

// udpLink speaks RoCEv2: each packet is a UDP datagram from the device's
// address, port 4791, to the destination GID's address, port 4791, carrying
// the transport headers, the payload and the ICRC.
//
// The socket sets DF and is not connected, so Linux gives its IPv4
// datagrams an identification of 0; with that, both ends know every field
// of the IP and UDP headers the ICRC covers (roce.PseudoHeaders).
type udpLink struct {
	d       *Device
	fd      int
	done    chan struct{}
	closing atomic.Bool

	mu   sync.Mutex // guards the buffers below: send may be called from timers
	wbuf []byte
	hdr  [48]byte
}

// socketBuffer is the size the link asks for its socket buffers: a send
// window's worth of packets of the largest MTU, so that a burst on an idle
// machine is not dropped.
const socketBuffer = 4 << 20

func listenUDP(d *Device) (*udpLink, error) {
	laddr := netip.AddrPortFrom(d.addr, roce.UDPPort)
	fd, err := unix.UDPSocket(laddr)
	if err != nil {
		return nil, fmt.Errorf("softhca: listen on %v: %w", laddr, err)
	}
	if err := unix.TuneRoCESocket(fd, d.addr.Is4(), socketBuffer); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("softhca: set up the socket on %v: %w", laddr, err)
	}
	l := &udpLink{d: d, fd: fd, done: make(chan struct{}), wbuf: make([]byte, 0, 4096+128)}
	go l.read()
	return l, nil
}

func (l *udpLink) close() error {
	l.closing.Store(true)
	unix.ShutdownRead(l.fd)
	<-l.done
	return unix.Close(l.fd)
}

// send encodes p with its ICRC and sends it.
func (l *udpLink) send(p *roce.Packet) {
	dst := netip.AddrFrom16(p.DstGID).Unmap()
	l.mu.Lock()
	b := p.AppendTransport(l.wbuf[:0])
	ip, udp := roce.PseudoHeaders(l.hdr[:], l.d.addr, dst, roce.UDPPort, len(b))
	b = binary.LittleEndian.AppendUint32(b, roce.ICRC(ip, udp, b))
	err := unix.SendTo(l.fd, b, netip.AddrPortFrom(dst, roce.UDPPort))
	l.wbuf = b
	l.mu.Unlock()
	putPacket(p)
	if err != nil {
		l.d.counters.XmitDiscards.Add(1)
	}
}

// read receives datagrams until the socket shuts down, and delivers the
// valid packets to the engine. It blocks in recvfrom rather than in the
// network poller: see unix.UDPSocket. Malformed datagrams, bad ICRCs and payloads larger
// than any MTU are counted and dropped.
func (l *udpLink) read() {
	defer close(l.done)
	buf := make([]byte, 1<<16)
	var hdr [48]byte
	var tmp roce.Packet
	for {
		n, from, err := unix.RecvFrom(l.fd, buf, true)
		if errors.Is(err, unix.EAGAIN) {
			// Nothing more for now. Let the engine, which the packets
			// just delivered woke onto this P, run before blocking: a P
			// held by a thread blocked in a system call runs nothing
			// until the runtime's monitor takes it back.
			runtime.Gosched()
			n, from, err = unix.RecvFrom(l.fd, buf, false)
		}
		if l.closing.Load() {
			return
		}
		if err != nil || !from.IsValid() {
			l.d.counters.RcvErrors.Add(1)
			continue
		}
		if n < roce.BTHLen+roce.ICRCLen {
			l.d.counters.RcvErrors.Add(1)
			continue
		}
		src := from.Addr().Unmap()
		tr := buf[:n-roce.ICRCLen]
		ip, udp := roce.PseudoHeaders(hdr[:], src, l.d.addr, from.Port(), len(tr))
		if roce.ICRC(ip, udp, tr) != binary.LittleEndian.Uint32(buf[n-roce.ICRCLen:n]) {
			l.d.counters.RcvICRCErrors.Add(1)
			continue
		}
		if err := roce.ParseTransport(tr, &tmp); err != nil || len(tmp.Payload) > 4096 {
			l.d.counters.RcvErrors.Add(1)
			continue
		}
		p := getPacket()
		payload := append(p.Payload[:0], tmp.Payload...)
		*p = tmp
		p.Payload = payload
		p.SrcGID = src.As16()
		p.DstGID = l.d.gid
		l.d.eng.deliver(p)
	}
}
