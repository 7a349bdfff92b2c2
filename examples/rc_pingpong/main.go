// Command rc_pingpong bounces messages between two RC queue pairs, with the
// flags and output of rdma-core's ibv_rc_pingpong:
//
//	rc_pingpong [flags]            start a server and wait for a connection
//	rc_pingpong [flags] <host>     connect to the server at <host>
//
// The two sides exchange their LID, QPN, PSN and GID over TCP in
// ibv_rc_pingpong's format, so either side can also be the C tool. With
// -self, both sides run in this process: on two software HCAs of their
// own, which needs no device at all, or with -d on that device.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/xrcrun/xrc/mlx4"
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(1)
	}
}

// options are the command line's settings.
type options struct {
	port     int
	dev      string
	ibPort   int
	size     int
	mtu      int
	rxDepth  int
	iters    int
	sl       int
	events   bool
	gidIdx   int
	validate bool
	// odp (-o, or -O with implicit), prefetch (-P), ts (-t), dm (-j),
	// newSend (-N) and ccUnprotected (-U) are ibv_rc_pingpong's other
	// flags; run refuses the first four (no device here has on-demand
	// paging, completion timestamps or device memory), the last two
	// change nothing (one post API; no confidential-computing guest).
	odp, implicitODP, prefetch, ts, dm, newSend, ccUnprotected bool

	self   bool
	server string
	// ln, with -self, is the server's listener, open before either side
	// starts, so that the client's one dial finds it however long the
	// server takes to set up.
	ln net.Listener
}

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("rc_pingpong", flag.ContinueOnError)
	fs.SetOutput(stderr)
	both := func(short, long string, def int, p *int, usage string) {
		fs.IntVar(p, short, def, usage)
		fs.IntVar(p, long, def, "same as -"+short)
	}
	both("p", "port", 18515, &o.port, "listen on/connect to TCP port `port`")
	fs.StringVar(&o.dev, "d", "", "use device `dev` (default first device found)")
	fs.StringVar(&o.dev, "ib-dev", "", "same as -d")
	both("i", "ib-port", 1, &o.ibPort, "use `port` of the device")
	both("s", "size", 4096, &o.size, "size of message to exchange")
	both("m", "mtu", 1024, &o.mtu, "path MTU")
	both("r", "rx-depth", 500, &o.rxDepth, "number of receives to post at a time")
	both("n", "iters", 1000, &o.iters, "number of exchanges")
	both("l", "sl", 0, &o.sl, "service level value")
	fs.BoolVar(&o.events, "e", false, "sleep on CQ events (default poll)")
	fs.BoolVar(&o.events, "events", false, "same as -e")
	both("g", "gid-idx", -1, &o.gidIdx, "local port gid `index` (on Ethernet ports, 0 when not given)")
	fs.BoolVar(&o.validate, "c", false, "validate received buffer")
	fs.BoolVar(&o.validate, "chk", false, "same as -c")
	boolBoth := func(short, long string, p *bool, usage string) {
		fs.BoolVar(p, short, false, usage)
		fs.BoolVar(p, long, false, "same as -"+short)
	}
	boolBoth("o", "odp", &o.odp, "use on demand paging (no device here has it)")
	boolBoth("O", "iodp", &o.implicitODP, "use implicit on demand paging (no device here has it)")
	boolBoth("P", "prefetch", &o.prefetch, "prefetch an ODP MR")
	boolBoth("t", "ts", &o.ts, "get CQE with timestamp (no device here has it)")
	boolBoth("j", "dm", &o.dm, "use device memory (no device here has it)")
	boolBoth("N", "new_send", &o.newSend, "use new post send WR API (one API here: the same as without)")
	boolBoth("U", "allow-cc-unprotected", &o.ccUnprotected, "allow allocation of unprotected/shared memory on CoCo guests (none here: no effect)")
	fs.BoolVar(&o.self, "self", false, "run the server and a client in this process, each on a software HCA of its own (with -d: both on that device)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage:\n  rc_pingpong            start a server and wait for connection\n  rc_pingpong <host>     connect to server at <host>\n\nOptions:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch fs.NArg() {
	case 0:
	case 1:
		if o.self {
			// -self is both sides: a host would make its server a client.
			return nil, fmt.Errorf("rc_pingpong: -self runs server and client here: no host (%q)", fs.Arg(0))
		}
		o.server = fs.Arg(0)
	default:
		fs.Usage()
		return nil, errors.New("rc_pingpong: at most one host")
	}
	o.odp = o.odp || o.implicitODP
	// ibv_rc_pingpong's checks of its flags' combinations, and its words.
	switch {
	case o.odp && o.dm:
		return nil, errors.New("rc_pingpong: DM memory region can't be on demand")
	case o.ccUnprotected && o.odp:
		return nil, errors.New("rc_pingpong: CoCo unprotected memory cannot be used with ODP")
	case o.ccUnprotected && o.dm:
		return nil, errors.New("rc_pingpong: CoCo unprotected memory cannot be used with device memory")
	case !o.odp && o.prefetch:
		return nil, errors.New("rc_pingpong: prefetch is valid only with on-demand memory region")
	}
	if _, err := verbs.MTUFromBytes(o.mtu); err != nil {
		return nil, fmt.Errorf("rc_pingpong: -m %d: %w", o.mtu, err)
	}
	switch {
	case o.port < 0 || o.port > 65535:
		return nil, fmt.Errorf("rc_pingpong: port %d out of range", o.port)
	case o.ibPort < 1 || o.ibPort > 255:
		return nil, fmt.Errorf("rc_pingpong: device port %d out of range", o.ibPort)
	case o.size < 1 || o.rxDepth < 1 || o.iters < 1:
		return nil, errors.New("rc_pingpong: size, rx-depth and iters must be positive")
	case o.sl < 0 || o.sl > 15:
		return nil, fmt.Errorf("rc_pingpong: service level %d out of range", o.sl)
	case o.gidIdx > 0:
		// verbs reads a port's GID 0 only (PortAttr.GID).
		return nil, fmt.Errorf("rc_pingpong: gid index %d: only GID 0 can be used", o.gidIdx)
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	// What ibv_rc_pingpong says of a device without these features; no
	// device here (soft HCA, mlx4) has them.
	switch {
	case o.odp:
		return fmt.Errorf("rc_pingpong: The device isn't ODP capable or does not support RC send and receive with ODP: %w", verbs.ErrNotSupported)
	case o.ts:
		return fmt.Errorf("rc_pingpong: The device isn't completion timestamp capable: %w", verbs.ErrNotSupported)
	case o.dm:
		return fmt.Errorf("rc_pingpong: Device doesn't support dm allocation: %w", verbs.ErrNotSupported)
	}
	if o.self {
		return runSelf(ctx, o, stdout)
	}
	dev, err := verbs.Open(ctx, o.dev, verbs.Config{})
	if err != nil {
		return err
	}
	defer dev.Close()
	return pingpong(ctx, dev, o, stdout)
}

// runSelf runs both sides in this process, each on its own in-process
// software HCA or, with -d, both on that device (a context each, as two
// ibv_rc_pingpong processes on one host), and prints the server's output,
// then the client's. An unknown -d fails as it does without -self.
func runSelf(ctx context.Context, o *options, stdout io.Writer) error {
	fabric := softhca.NewFabric()
	var outs [2]bytes.Buffer
	var errs [2]error
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	o.port = ln.Addr().(*net.TCPAddr).Port
	// Both sides open their device before either starts: a server
	// whose client never comes would wait for ever.
	var ctxs [2]*verbs.Context
	for i := range 2 {
		var c *verbs.Context
		if o.dev != "" {
			if c, err = verbs.Open(ctx, o.dev, verbs.Config{}); err != nil {
				return err
			}
		} else {
			d, err := softhca.New(ctx, softhca.Config{Name: fmt.Sprintf("self%d", i),
				Addr: netip.AddrFrom4([4]byte{127, 0, 1, byte(250 + i)}), Fabric: fabric})
			if err != nil {
				return err
			}
			defer d.Close()
			if c, err = d.Open(verbs.Config{}); err != nil {
				return err
			}
		}
		defer c.Close()
		ctxs[i] = c
	}
	// A side that fails ends the other, which would otherwise wait for
	// it for ever (a server for its client, say); the first failure is
	// the one reported.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var once sync.Once
	failed := -1
	for i, c := range ctxs {
		side := *o
		if i == 0 {
			side.ln = ln
		} else {
			side.server = "127.0.0.1"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = pingpong(ctx, c, &side, &outs[i]); errs[i] != nil {
				once.Do(func() { failed = i })
				cancel()
			}
		}()
	}
	wg.Wait()
	names := [2]string{"server", "client"}
	for i, name := range names {
		fmt.Fprintf(stdout, "%s:\n", name)
		io.Copy(stdout, &outs[i])
	}
	if failed >= 0 {
		return fmt.Errorf("%s: %w", names[failed], errs[failed])
	}
	return nil
}

// dest is what the sides exchange.
type dest struct {
	lid uint16
	qpn uint32
	psn uint32
	gid verbs.GID
}

// wire formats a dest as ibv_rc_pingpong does: "%04x:%06x:%06x:%s", the
// GID as 32 hex digits, NUL-terminated in a 52-byte message.
func (d dest) wire() []byte {
	msg := make([]byte, 52)
	copy(msg, fmt.Sprintf("%04x:%06x:%06x:%x", d.lid, d.qpn, d.psn, d.gid[:]))
	return msg
}

func parseDest(msg []byte) (dest, error) {
	s := strings.TrimRight(string(msg), "\x00")
	parts := strings.Split(s, ":")
	if len(parts) != 4 || len(parts[3]) != 32 {
		return dest{}, fmt.Errorf("bad address message %q", s)
	}
	var d dest
	lid, err1 := strconv.ParseUint(parts[0], 16, 16)
	qpn, err2 := strconv.ParseUint(parts[1], 16, 24)
	psn, err3 := strconv.ParseUint(parts[2], 16, 24)
	if err := errors.Join(err1, err2, err3); err != nil {
		return dest{}, fmt.Errorf("bad address message %q: %w", s, err)
	}
	for i := range 16 {
		b, err := strconv.ParseUint(parts[3][2*i:2*i+2], 16, 8)
		if err != nil {
			return dest{}, fmt.Errorf("bad gid in %q", s)
		}
		d.gid[i] = byte(b)
	}
	d.lid, d.qpn, d.psn = uint16(lid), uint32(qpn), uint32(psn)
	return d, nil
}

const (
	recvWRID = 1
	sendWRID = 2
)

// pingpong is ibv_rc_pingpong's main loop on an open device.
func pingpong(ctx context.Context, dev *verbs.Context, o *options, out io.Writer) error {
	var ch *verbs.CompChannel
	var err error
	if o.events {
		if ch, err = dev.CreateCompChannel(); err != nil {
			return err
		}
		defer ch.Close()
	}
	pd, err := dev.AllocPD()
	if err != nil {
		return err
	}
	defer pd.Close()
	buf, err := verbs.Alloc(o.size)
	if err != nil {
		return err
	}
	defer verbs.Free(buf)
	for i := range buf {
		buf[i] = 0x7b
	}
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		return fmt.Errorf("couldn't register MR: %w", err)
	}
	defer mr.Close()
	cq, err := dev.CreateCQ(o.rxDepth+1, ch, 0)
	if err != nil {
		return fmt.Errorf("couldn't create CQ: %w", err)
	}
	defer cq.Close()
	qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: uint32(o.rxDepth), MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return fmt.Errorf("couldn't create QP: %w", err)
	}
	defer qp.Close()
	sendFlags := verbs.SendSignaled
	if int(qp.Cap().MaxInlineData) >= o.size {
		sendFlags |= verbs.SendInline
	}
	if err := qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: uint8(o.ibPort)},
		verbs.QPAttrState|verbs.QPAttrPkeyIndex|verbs.QPAttrPort|verbs.QPAttrAccessFlags); err != nil {
		return fmt.Errorf("failed to modify QP to INIT: %w", err)
	}

	recv := &verbs.RecvWR{WRID: recvWRID, SG: []verbs.SGE{mr.SGE(0, o.size)}}
	postRecvs := func(n int) int {
		for i := range n {
			if qp.PostRecv(recv) != nil {
				return i
			}
		}
		return n
	}
	routs := postRecvs(o.rxDepth)
	if routs < o.rxDepth {
		return fmt.Errorf("couldn't post receive (%d)", routs)
	}
	if o.events {
		if err := cq.RequestNotify(false); err != nil {
			return err
		}
	}

	port, err := dev.QueryPort(uint8(o.ibPort))
	if err != nil {
		return fmt.Errorf("couldn't get port info: %w", err)
	}
	my := dest{lid: port.LID, qpn: qp.Num(), psn: rand.Uint32() & 0xffffff}
	if o.gidIdx >= 0 || port.LinkLayer == verbs.LinkLayerEthernet {
		my.gid = port.GID
	}
	fmt.Fprintf(out, "  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", my.lid, my.qpn, my.psn, gidString(my.gid))

	mtu, _ := verbs.MTUFromBytes(o.mtu)
	connectQP := func(rem dest) error {
		attr := verbs.QPAttr{State: verbs.QPSRTR, PathMTU: mtu, DestQPN: rem.qpn, RQPSN: rem.psn,
			MaxDestRdAtomic: 1, MinRNRTimer: 12,
			AH: verbs.AHAttr{DLID: rem.lid, SL: uint8(o.sl), Port: uint8(o.ibPort)}}
		if rem.gid != (verbs.GID{}) {
			attr.AH.IsGlobal = true
			attr.AH.GRH = verbs.GlobalRoute{DGID: rem.gid, HopLimit: 1, SGIDIndex: uint8(max(o.gidIdx, 0))}
		}
		if err := qp.Modify(&attr, verbs.QPAttrState|verbs.QPAttrAV|verbs.QPAttrPathMTU|verbs.QPAttrDestQPN|
			verbs.QPAttrRQPSN|verbs.QPAttrMaxDestRdAtomic|verbs.QPAttrMinRNRTimer); err != nil {
			return fmt.Errorf("failed to modify QP to RTR: %w", err)
		}
		attr = verbs.QPAttr{State: verbs.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, SQPSN: my.psn, MaxRdAtomic: 1}
		if err := qp.Modify(&attr, verbs.QPAttrState|verbs.QPAttrTimeout|verbs.QPAttrRetryCnt|
			verbs.QPAttrRNRRetry|verbs.QPAttrSQPSN|verbs.QPAttrMaxQPRdAtomic); err != nil {
			return fmt.Errorf("failed to modify QP to RTS: %w", err)
		}
		return nil
	}
	if testHookExchange != nil {
		if err := testHookExchange(o.server == ""); err != nil {
			return err
		}
	}
	var rem dest
	if o.server != "" {
		rem, err = clientExchange(ctx, o.server, o.port, my)
	} else {
		rem, err = serverExchange(ctx, o.ln, o.port, my, connectQP)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  remote address: LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", rem.lid, rem.qpn, rem.psn, gidString(rem.gid))
	if o.server != "" {
		if err := connectQP(rem); err != nil {
			return err
		}
	}

	send := &verbs.SendWR{WRID: sendWRID, Opcode: verbs.WRSend, Flags: sendFlags, SG: []verbs.SGE{mr.SGE(0, o.size)}}
	pending := recvWRID
	if o.server != "" {
		if o.validate {
			// ibv_rc_pingpong's marker is i/page_size % sizeof(char),
			// which is 0 in every page (against the buffer's 0x7b), so
			// that this tool and the C one check each other's pages.
			for i := 0; i < o.size; i += os.Getpagesize() {
				buf[i] = pageMarker
			}
		}
		if err := qp.PostSend(send); err != nil {
			return fmt.Errorf("couldn't post send: %w", err)
		}
		pending |= sendWRID
	}
	start := time.Now()
	scnt, rcnt := 0, 0
	wc := make([]verbs.WorkCompletion, 2)
	for rcnt < o.iters || scnt < o.iters {
		if err := ctx.Err(); err != nil {
			return err
		}
		if o.events {
			if _, err := ch.GetEvent(ctx); err != nil {
				return fmt.Errorf("failed to get cq_event: %w", err)
			}
			if err := cq.RequestNotify(false); err != nil {
				return fmt.Errorf("couldn't request CQ notification: %w", err)
			}
		}
		ne := 0
		for ne < 1 {
			if ne, err = cq.Poll(wc); err != nil {
				return fmt.Errorf("poll CQ failed: %w", err)
			}
			if o.events {
				break
			}
		}
		for _, c := range wc[:ne] {
			if c.Status != verbs.WCSuccess {
				return fmt.Errorf("failed status %v (%d) for wr_id %d", c.Status, c.Status, c.WRID)
			}
			switch c.WRID {
			case sendWRID:
				scnt++
			case recvWRID:
				if routs--; routs <= 1 {
					routs += postRecvs(o.rxDepth - routs)
					if routs < o.rxDepth {
						return fmt.Errorf("couldn't post receive (%d)", routs)
					}
				}
				rcnt++
			default:
				return fmt.Errorf("completion for unknown wr_id %d", c.WRID)
			}
			pending &^= int(c.WRID)
			if scnt < o.iters && pending == 0 {
				if err := qp.PostSend(send); err != nil {
					return fmt.Errorf("couldn't post send: %w", err)
				}
				pending = recvWRID | sendWRID
			}
		}
	}
	usec := float64(time.Since(start).Microseconds())
	bytes := int64(o.size) * int64(o.iters) * 2
	fmt.Fprintf(out, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", bytes, usec/1e6, float64(bytes)*8/usec)
	fmt.Fprintf(out, "%d iters in %.2f seconds = %.2f usec/iter\n", o.iters, usec/1e6, usec/float64(o.iters))
	if o.server == "" && o.validate {
		for i := 0; i < o.size; i += os.Getpagesize() {
			if buf[i] != pageMarker {
				fmt.Fprintf(out, "invalid data in page %d\n", i/os.Getpagesize())
			}
		}
	}
	return nil
}

// pageMarker is what the client writes at the start of each page of its
// message with -c (the machine's page size, sysconf(_SC_PAGESIZE) in the C
// tool), and the server checks.
const pageMarker = 0

// gidString prints a GID as inet_ntop prints an IPv6 address.
func gidString(g verbs.GID) string { return netip.AddrFrom16(g).String() }

func clientExchange(ctx context.Context, host string, port int, my dest) (dest, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return dest{}, fmt.Errorf("couldn't connect to %s:%d: %w", host, port, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := conn.Write(my.wire()); err != nil {
		return dest{}, fmt.Errorf("couldn't send local address: %w", err)
	}
	msg := make([]byte, 52)
	if _, err := io.ReadFull(conn, msg); err != nil {
		return dest{}, fmt.Errorf("couldn't read remote address: %w", err)
	}
	if _, err := conn.Write([]byte("done\x00")); err != nil {
		return dest{}, fmt.Errorf("couldn't write done: %w", err)
	}
	return parseDest(msg)
}

// testHookExchange, if set, runs as a side (the server if server) starts
// its exchange, after setting up its device; an error it returns is the
// side's. Tests make a side slow or fail with it.
var testHookExchange func(server bool) error

// serverExchange accepts the client on ln or, if ln is nil, on a listener
// of its own on port; it closes the listener.
func serverExchange(ctx context.Context, ln net.Listener, port int, my dest, connect func(dest) error) (dest, error) {
	if ln == nil {
		var lc net.ListenConfig
		var err error
		if ln, err = lc.Listen(ctx, "tcp", ":"+strconv.Itoa(port)); err != nil {
			return dest{}, fmt.Errorf("couldn't listen to port %d: %w", port, err)
		}
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	conn, err := ln.Accept()
	stop()
	ln.Close()
	if err != nil {
		return dest{}, fmt.Errorf("accept() failed: %w", err)
	}
	defer conn.Close()
	// A peer that connects and then stalls must not hold the server past
	// a signal.
	stop = context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	msg := make([]byte, 52)
	if _, err := io.ReadFull(conn, msg); err != nil {
		return dest{}, fmt.Errorf("couldn't read remote address: %w", err)
	}
	rem, err := parseDest(msg)
	if err != nil {
		return dest{}, err
	}
	if err := connect(rem); err != nil {
		return dest{}, fmt.Errorf("couldn't connect to remote QP: %w", err)
	}
	if _, err := conn.Write(my.wire()); err != nil {
		return dest{}, fmt.Errorf("couldn't send local address: %w", err)
	}
	done := make([]byte, 5)
	if _, err := io.ReadFull(conn, done); err != nil {
		return dest{}, fmt.Errorf("couldn't receive done: %w", err)
	}
	return rem, nil
}
