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

	"github.com/xrcrun/xrc/internal/racedma"
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
// come. Packets leave from a second socket on an ephemeral port (RoCEv2
// leaves the source port free): the poller would otherwise wake up for the
// write space every send frees.
type udpLink struct {
	d       *Device
	fd      int      // the receive socket, on port 4791; non-blocking; file owns it
	file    *os.File // the receive socket, for the network poller
	txFD    int      // the send socket
	txPort  uint16
	rc      syscall.RawConn
	done    chan struct{}
	stop    chan struct{}
	armed   chan struct{} // the engine is going to sleep: watch the socket
	closing atomic.Bool

	mu       sync.Mutex // guards the sender: delayed packets are sent from timers
	tx       *unix.UDPSender
	iov      [][]byte // the datagrams of one send
	wbuf     []byte   // datagrams encoded out of their packets' storage
	scratch  datagramScratch
	hscratch [64]byte

	rx       *unix.UDPReceiver // owned by the engine, as are the fields below
	rbuf     []byte            // datagrams of a round: received packets' payloads point into it
	rbufs    [][]byte          // rbuf in 64 KiB pieces, one per datagram of a receive
	rdgs     []unix.Datagram   // what each piece received
	rscratch datagramScratch
}

// datagramScratch is the space a goroutine makes or checks datagrams in:
// the IP and UDP headers the ICRC covers, and the ICRC's own.
type datagramScratch struct {
	hdr [48]byte
	crc roce.ICRCScratch
}

// socketBuffer is the size the link asks for its socket buffers: a send
// window's worth of packets of the largest MTU, so that a burst on an idle
// machine is not dropped.
const socketBuffer = 4 << 20

// rxBuffer holds the datagrams the engine reads in a round: the packets'
// payloads stay in it, uncopied, until the round is over. It is cut in
// 64 KiB pieces, one per datagram or GRO batch, so that a round reads as
// many datagrams as its budget (pollBudget) with one system call.
const rxBuffer = 4 << 20

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
	txFD, txPort, err := senderSocket(d.addr)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	l := &udpLink{d: d, fd: fd, file: os.NewFile(uintptr(fd), "roce-"+laddr.String()), txFD: txFD, txPort: txPort,
		done: make(chan struct{}), stop: make(chan struct{}), armed: make(chan struct{}, 1),
		tx: unix.NewUDPSender(txFD), wbuf: make([]byte, 0, maxBatch+4096+128),
		rx: unix.NewUDPReceiver(fd), rbuf: make([]byte, rxBuffer)}
	for off := 0; off+1<<16 <= len(l.rbuf); off += 1 << 16 {
		l.rbufs = append(l.rbufs, l.rbuf[off:off+1<<16:off+1<<16])
	}
	l.rdgs = make([]unix.Datagram, len(l.rbufs))
	if l.rc, err = l.file.SyscallConn(); err != nil {
		l.file.Close()
		unix.Close(txFD)
		return nil, err
	}
	go l.watch()
	return l, nil
}

// senderSocket opens the socket packets leave from: addr, a free port.
func senderSocket(addr netip.Addr) (int, uint16, error) {
	fd, err := unix.UDPSocket(netip.AddrPortFrom(addr, 0))
	if err == nil {
		err = unix.TuneRoCESocket(fd, addr.Is4(), socketBuffer)
	}
	var port uint16
	if err == nil {
		port, err = unix.LocalPort(fd)
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, 0, fmt.Errorf("softhca: send socket on %v: %w", addr, err)
	}
	return fd, port, nil
}

func (l *udpLink) close() error {
	l.closing.Store(true)
	close(l.stop)
	err := l.file.Close() // wakes the watcher
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	err = errors.Join(err, unix.Close(l.txFD))
	l.txFD = -1 // a delayed packet's timer may still fire: sendBatch drops it
	return err
}

// sendBatch sends packets in order, taking their ownership. Consecutive
// packets to one loopback address that have the same length (the last of
// a run may be shorter) go in one system call with UDP GSO. To other
// addresses every packet is a datagram of its own: the kernel would number
// the IPv4 identification of GSO segments, which the ICRC covers, and a
// RoCE NIC on the other end would then reject them. A packet is encoded in
// its own storage where it can be (headers before the payload, pad and
// ICRC after), and the kernel gathers the datagrams from there, and from
// the memory of the regions that borrowed payloads are in (sendRequests).
//
// A packet to the device's own GID does not leave it: as an HCA loops such
// traffic back inside, without the network, it goes straight to the
// engine's queue of received packets.
func (l *udpLink) sendBatch(ps []*roce.Packet, c *pktCache) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.txFD < 0 { // closed: the descriptor's number may be another file's now
		for _, p := range ps {
			c.put(p)
		}
		return
	}
	for i := 0; i < len(ps); {
		if ps[i].DstGID == l.d.gid {
			l.d.eng.deliver(ps[i])
			i++
			continue
		}
		dst := netip.AddrFrom16(ps[i].DstGID).Unmap()
		l.wbuf = l.wbuf[:0]
		seg := l.encode(ps[i], dst)
		total := seg
		j := i + 1
		if dst.IsLoopback() {
			for j < len(ps) && j-i < unix.MaxGSOSegments && ps[j].DstGID == ps[i].DstGID && total+seg <= maxBatch {
				if ps[j].Len() > seg {
					break // longer: it starts the next run
				}
				n := l.encode(ps[j], dst)
				total += n
				j++
				if n < seg {
					break // shorter: it ends this run
				}
			}
		}
		if j-i == 1 {
			seg = 0
		}
		if err := l.tx.SendVec(l.iov, seg, netip.AddrPortFrom(dst, roce.UDPPort)); err != nil {
			l.d.counters.XmitDiscards.Add(uint64(j - i))
		}
		clear(l.iov)
		l.iov = l.iov[:0]
		for _, p := range ps[i:j] {
			c.put(p)
		}
		i = j
	}
	racedma.Release() // the ICRCs read borrowed payloads
}

// encode adds p as a datagram to dst to the buffers of the send (l.iov)
// and returns its length: the transport headers, the payload, its pad and
// the ICRC. It writes them around the payload in the packet's storage when
// the payload is there. Otherwise (the payload is in the memory of a
// region) it puts the headers, pad and ICRC in l.wbuf and the payload
// stays where it is, for the kernel to gather: the data is copied once,
// into the socket buffer.
func (l *udpLink) encode(p *roce.Packet, dst netip.Addr) int {
	st := p.Storage[:cap(p.Storage)]
	n := len(p.Payload)
	inPlace := len(st) >= pktHeadroom+n+pktTailroom &&
		(n == 0 || &p.Payload[0] == &st[pktHeadroom])
	pad := roce.PadLen(n)
	if !inPlace {
		off := len(l.wbuf)
		l.wbuf = p.AppendHeaders(l.wbuf)
		hdr := len(l.wbuf) - off
		l.wbuf = append(l.wbuf, make([]byte, pad)...)
		ip, udp := roce.PseudoHeaders(l.scratch.hdr[:], l.d.addr, dst, l.txPort, hdr+n+pad)
		crc := l.scratch.crc.ICRC(ip, udp, l.wbuf[off:off+hdr], p.Payload, l.wbuf[off+hdr:])
		l.wbuf = binary.LittleEndian.AppendUint32(l.wbuf, crc)
		l.iov = append(l.iov, l.wbuf[off:off+hdr], p.Payload, l.wbuf[off+hdr:])
		return hdr + n + pad + roce.ICRCLen
	}
	hdr := p.AppendHeaders(l.hscratch[:0])
	start := pktHeadroom - len(hdr)
	copy(st[start:], hdr)
	end := pktHeadroom + n
	clear(st[end : end+pad])
	end += pad
	ip, udp := roce.PseudoHeaders(l.scratch.hdr[:], l.d.addr, dst, l.txPort, end-start)
	binary.LittleEndian.PutUint32(st[end:], l.scratch.crc.ICRC(ip, udp, st[start:end], nil, nil))
	l.iov = append(l.iov, st[start:end+roce.ICRCLen])
	return end + roce.ICRCLen - start
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

// poll reads the datagrams that are waiting, up to one per packet of max
// and at most a buffer's worth, with one system call, and returns the
// valid packets, whose payloads point into l.rbuf until the next poll.
// Malformed datagrams, bad ICRCs and payloads larger than any MTU are
// counted and dropped.
func (l *udpLink) poll(out []*roce.Packet, max int) []*roce.Packet {
	// One recvmmsg into every 64 KiB of the buffer (a GRO batch takes up
	// to that), at most one datagram per packet of the budget.
	k := min(max, len(l.rbufs))
	n, err := l.rx.RecvBatch(l.rbufs[:k], l.rdgs[:k])
	if err != nil {
		if !errors.Is(err, unix.EAGAIN) {
			l.d.counters.RcvErrors.Add(1)
		}
		return out
	}
	if e := l.d.eng; e.rxStamp == 0 || l.rdgs[0].Stamp < e.rxStamp {
		e.rxStamp = l.rdgs[0].Stamp // the socket's queue is in order
	}
	for i, dg := range l.rdgs[:n] {
		if dg.Trunc {
			l.d.counters.RcvErrors.Add(1)
			continue
		}
		b, seg := l.rbufs[i][:dg.N], dg.Seg
		if seg == 0 {
			seg = dg.N
		}
		for off := 0; off < len(b); off += seg {
			if p := l.parse(b[off:min(off+seg, len(b))], dg.From); p != nil {
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
	return l.d.parseDatagram(b, from, &l.rscratch, &l.d.eng.pkts)
}

// parseDatagram checks a RoCEv2 datagram that came from the address and
// port from to the device: its length, and its ICRC over the IP and UDP
// headers the sender's kernel put on it (roce.PseudoHeaders). It decodes a
// good one into a packet from the pool, addressed from the sender's GID to
// the device's, for the engine; it counts a bad one and returns nil. The
// packet's payload points into b. s is the caller's scratch space. It
// touches nothing of the device but its counters. The packet comes from
// the cache c, or from the shared pool if c is nil.
func (d *Device) parseDatagram(b []byte, from netip.AddrPort, s *datagramScratch, c *pktCache) *roce.Packet {
	if !from.IsValid() || len(b) < roce.BTHLen+roce.ICRCLen {
		d.counters.RcvErrors.Add(1)
		return nil
	}
	src := from.Addr().Unmap()
	tr := b[:len(b)-roce.ICRCLen]
	ip, udp := roce.PseudoHeaders(s.hdr[:], src, d.addr, from.Port(), len(tr))
	if s.crc.ICRC(ip, udp, tr, nil, nil) != binary.LittleEndian.Uint32(b[len(tr):]) {
		d.counters.RcvErrors.Add(1) // a packet with an error, as PortRcvErrors counts ICRC errors
		d.counters.RcvICRCErrors.Add(1)
		return nil
	}
	p := c.get()
	if err := roce.ParseTransport(tr, p); err != nil || len(p.Payload) > 4096 {
		d.counters.RcvErrors.Add(1)
		c.put(p)
		return nil
	}
	p.SrcGID = src.As16()
	p.DstGID = d.gid
	return p
}
