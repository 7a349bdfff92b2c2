//go:build linux

package softhca

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

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
//
// Receiving works as a NIC driver's NAPI does: while the engine is busy it
// reads the socket itself, each round, with no wake-up at all; while it
// sleeps, a goroutine parked in the network poller wakes it when datagrams
// come.
type udpLink struct {
	d       *Device
	fd      int      // non-blocking; file owns it
	file    *os.File // the socket, for the network poller
	rc      syscall.RawConn
	done    chan struct{}
	stop    chan struct{}
	armed   chan struct{} // the engine is going to sleep: watch the socket
	closing atomic.Bool

	mu   sync.Mutex // guards the sender: delayed packets are sent from timers
	tx   *unix.UDPSender
	wbuf []byte
	hdr  [48]byte

	rx   *unix.UDPReceiver // owned by the engine, as are the buffers below
	rbuf []byte
	rhdr [48]byte
}

// socketBuffer is the size the link asks for its socket buffers: a send
// window's worth of packets of the largest MTU, so that a burst on an idle
// machine is not dropped.
const socketBuffer = 4 << 20

// maxBatch bounds the bytes of one GSO send (a UDP datagram's limit, with
// room for the headers).
const maxBatch = 65000

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
	l := &udpLink{d: d, fd: fd, file: os.NewFile(uintptr(fd), "roce-"+laddr.String()), done: make(chan struct{}), stop: make(chan struct{}), armed: make(chan struct{}, 1),
		tx: unix.NewUDPSender(fd), wbuf: make([]byte, 0, maxBatch+4096+128),
		rx: unix.NewUDPReceiver(fd), rbuf: make([]byte, 1<<16)}
	if l.rc, err = l.file.SyscallConn(); err != nil {
		l.file.Close()
		return nil, err
	}
	go l.watch()
	return l, nil
}

func (l *udpLink) close() error {
	l.closing.Store(true)
	close(l.stop)
	err := l.file.Close() // wakes the watcher
	<-l.done
	return err
}

// sendBatch sends packets in order, taking their ownership. Consecutive
// packets to one loopback address that have the same length (the last of
// a run may be shorter) go in one system call with UDP GSO. To other
// addresses every packet is a datagram of its own: the kernel would number
// the IPv4 identification of GSO segments, which the ICRC covers, and a
// RoCE NIC on the other end would then reject them.
func (l *udpLink) sendBatch(ps []*roce.Packet, c *pktCache) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := 0; i < len(ps); {
		dst := netip.AddrFrom16(ps[i].DstGID).Unmap()
		b := l.encode(l.wbuf[:0], ps[i], dst)
		seg := len(b)
		j := i + 1
		if dst.IsLoopback() {
			for j < len(ps) && j-i < unix.MaxGSOSegments && ps[j].DstGID == ps[i].DstGID && len(b)+seg <= maxBatch {
				n := len(b)
				b = l.encode(b, ps[j], dst)
				if len(b)-n > seg {
					b = b[:n] // longer: it starts the next run
					break
				}
				j++
				if len(b)-n < seg {
					break // shorter: it ends this run
				}
			}
		}
		if j-i == 1 {
			seg = 0
		}
		if err := l.tx.Send(b, seg, netip.AddrPortFrom(dst, roce.UDPPort)); err != nil {
			l.d.counters.XmitDiscards.Add(uint64(j - i))
		}
		l.wbuf = b
		for _, p := range ps[i:j] {
			c.put(p)
		}
		i = j
	}
}

// encode appends p as a datagram to dst: the transport headers, the
// payload and the ICRC.
func (l *udpLink) encode(b []byte, p *roce.Packet, dst netip.Addr) []byte {
	n := len(b)
	b = p.AppendTransport(b)
	ip, udp := roce.PseudoHeaders(l.hdr[:], l.d.addr, dst, roce.UDPPort, len(b)-n)
	return binary.LittleEndian.AppendUint32(b, roce.ICRC(ip, udp, b[n:]))
}

// idle tells the link that the engine is going to sleep: from now on a
// datagram must wake it.
func (l *udpLink) idle() {
	select {
	case l.armed <- struct{}{}:
	default:
	}
}

// watch wakes the engine when a datagram comes while it sleeps, until the
// link closes. It reads nothing (the engine does), and while the engine is
// awake it waits for the next idle: watching a socket whose datagrams the
// engine is about to read would only spin.
func (l *udpLink) watch() {
	defer close(l.done)
	for {
		select {
		case <-l.armed:
		case <-l.stop:
			return
		}
		waited := false
		err := l.rc.Read(func(fd uintptr) bool {
			if waited {
				return true
			}
			waited = true
			// The poller forgets readiness it saw before this call:
			// look at the socket, then wait for more.
			return unix.Readable(int(fd))
		})
		if err != nil || l.closing.Load() {
			return
		}
		l.d.eng.kick()
	}
}

// poll reads up to max datagrams that are waiting and returns the valid
// packets. Malformed datagrams, bad ICRCs and payloads larger than any MTU
// are counted and dropped.
func (l *udpLink) poll(out []*roce.Packet, max int) []*roce.Packet {
	for got := 0; got < max; {
		n, seg, from, err := l.rx.Recv(l.rbuf)
		if err != nil {
			if !errors.Is(err, unix.EAGAIN) {
				l.d.counters.RcvErrors.Add(1)
			}
			return out
		}
		if seg == 0 {
			seg = n
		}
		for off := 0; off < n; off += seg {
			got++
			if p := l.parse(l.rbuf[off:min(off+seg, n)], from); p != nil {
				out = append(out, p)
			}
		}
	}
	return out
}

// parse checks a datagram and decodes it into a packet from the engine's
// packet cache (poll runs on the engine goroutine), or counts it as an
// error and returns nil.
func (l *udpLink) parse(b []byte, from netip.AddrPort) *roce.Packet {
	if !from.IsValid() || len(b) < roce.BTHLen+roce.ICRCLen {
		l.d.counters.RcvErrors.Add(1)
		return nil
	}
	src := from.Addr().Unmap()
	tr := b[:len(b)-roce.ICRCLen]
	ip, udp := roce.PseudoHeaders(l.rhdr[:], src, l.d.addr, from.Port(), len(tr))
	if roce.ICRC(ip, udp, tr) != binary.LittleEndian.Uint32(b[len(tr):]) {
		l.d.counters.RcvICRCErrors.Add(1)
		return nil
	}
	pkts := &l.d.eng.pkts
	p := pkts.get()
	payload := p.Payload
	if err := roce.ParseTransport(tr, p); err != nil || len(p.Payload) > 4096 {
		l.d.counters.RcvErrors.Add(1)
		p.Payload = payload
		pkts.put(p)
		return nil
	}
	p.Payload = append(payload[:0], p.Payload...)
	p.SrcGID = src.As16()
	p.DstGID = l.d.gid
	return p
}
