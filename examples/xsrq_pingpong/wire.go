package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/xrcrun/xrc/verbs"
)

// dest is the address one side gives the other for a pair of QPs.
type dest struct {
	lid              uint16
	recvQPN, sendQPN uint32
	psn              uint32
	srqn             uint32
	gid              verbs.GID
}

// msgSize is the size of an address message: "%04x:%06x:%06x:%06x:%06x:"
// and 32 hex digits of GID, NUL-terminated, as ibv_xsrq_pingpong sends it.
const msgSize = 66

// endMsg is the final handshake's message, NUL-terminated.
const endMsg = "END\x00"

func (d dest) wire() []byte {
	msg := make([]byte, msgSize)
	copy(msg, fmt.Sprintf("%04x:%06x:%06x:%06x:%06x:%x", d.lid, d.recvQPN, d.sendQPN, d.psn, d.srqn, d.gid[:]))
	return msg
}

func parseDest(msg []byte) (dest, error) {
	s, _, _ := strings.Cut(string(msg), "\x00")
	f := strings.Split(s, ":")
	if len(f) != 6 || len(f[5]) != 32 {
		return dest{}, fmt.Errorf("bad address message %q", s)
	}
	var v [5]uint64
	for i, bits := range []int{16, 24, 24, 24, 24} {
		var err error
		if v[i], err = strconv.ParseUint(f[i], 16, bits); err != nil {
			return dest{}, fmt.Errorf("bad address message %q: %w", s, err)
		}
	}
	d := dest{lid: uint16(v[0]), recvQPN: uint32(v[1]), sendQPN: uint32(v[2]), psn: uint32(v[3]), srqn: uint32(v[4])}
	if _, err := hex.Decode(d.gid[:], []byte(f[5])); err != nil {
		return dest{}, fmt.Errorf("bad gid in %q: %w", s, err)
	}
	return d, nil
}

// print writes an address line as ibv_xsrq_pingpong does.
func (d dest) print(out io.Writer, who string) {
	fmt.Fprintf(out, "%8s: LID %04x, QPN RECV %06x SEND %06x, PSN %06x, SRQN %06x, GID %s\n",
		who, d.lid, d.recvQPN, d.sendQPN, d.psn, d.srqn, netip.AddrFrom16(d.gid))
}

// sendLocal sends this side's address for peer i and prints it.
func (p *pingpong) sendLocal(out io.Writer, i int) error {
	d := p.localDest(i)
	d.print(out, "local")
	if _, err := p.peers[i].conn.Write(d.wire()); err != nil {
		return fmt.Errorf("couldn't send local address: %w", err)
	}
	return nil
}

// recvRemote reads peer i's address and prints it.
func (p *pingpong) recvRemote(out io.Writer, i int) error {
	msg := make([]byte, msgSize)
	if _, err := io.ReadFull(p.peers[i].conn, msg); err != nil {
		return fmt.Errorf("couldn't read remote address [%d]: %w", i, err)
	}
	d, err := parseDest(msg)
	if err != nil {
		return err
	}
	d.print(out, "remote")
	p.peers[i].rem = d
	return nil
}

// clientConnect gives the server this client's address, takes the
// server's and connects.
func (p *pingpong) clientConnect(ctx context.Context, out io.Writer) error {
	var d net.Dialer
	addr := net.JoinHostPort(p.o.server, strconv.Itoa(p.o.port))
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("couldn't connect to %s: %w", addr, err)
	}
	p.peers[0].conn = conn
	context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	if err := p.sendLocal(out, 0); err != nil {
		return err
	}
	if err := p.recvRemote(out, 0); err != nil {
		return err
	}
	return p.connect(0)
}

// serverConnect accepts the clients one by one: it takes each one's
// address, gives it the server's and connects.
func (p *pingpong) serverConnect(ctx context.Context, out io.Writer) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", ":"+strconv.Itoa(p.o.port))
	if err != nil {
		return fmt.Errorf("couldn't listen to port %d: %w", p.o.port, err)
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for i := range p.o.clients {
		conn, err := ln.Accept()
		if err != nil {
			return fmt.Errorf("accept() failed for client %d: %w", i, err)
		}
		p.peers[i].conn = conn
		context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
		if err := p.recvRemote(out, i); err != nil {
			return err
		}
		if err := p.sendLocal(out, i); err != nil {
			return err
		}
		if err := p.connect(i); err != nil {
			return err
		}
	}
	return nil
}

// clientTermination tells the server this client has all its messages and
// waits until every client has: only then may the receive QPs of this
// node go, through which the server reaches the other clients too.
func (p *pingpong) clientTermination() error {
	if err := sendEnd(p.peers[0].conn); err != nil {
		return err
	}
	return recvEnd(p.peers[0].conn)
}

// serverTermination waits for every client's END, then releases them all.
func (p *pingpong) serverTermination() error {
	for _, pr := range p.peers {
		if err := recvEnd(pr.conn); err != nil {
			return err
		}
	}
	for _, pr := range p.peers {
		if err := sendEnd(pr.conn); err != nil {
			return err
		}
	}
	return nil
}

func sendEnd(c net.Conn) error {
	if _, err := io.WriteString(c, endMsg); err != nil {
		return fmt.Errorf("couldn't send termination ack: %w", err)
	}
	return nil
}

func recvEnd(c net.Conn) error {
	msg := make([]byte, len(endMsg))
	if _, err := io.ReadFull(c, msg); err != nil {
		return fmt.Errorf("couldn't read remote termination ack: %w", err)
	}
	if string(msg) != endMsg {
		return errors.New("invalid termination ack was accepted")
	}
	return nil
}
