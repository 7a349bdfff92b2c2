// Command xsrq_pingpong bounces messages between a server and its clients
// over XRC, with the flags and output of rdma-core's ibv_xsrq_pingpong:
//
//	xsrq_pingpong [flags]            serve -c clients, then exit
//	xsrq_pingpong [flags] <host>     be one client of the server at <host>
//
// Every process opens the XRC domain of one file (-xrcd-file), so the
// processes of one node share a domain, and creates one XRC SRQ in it. For
// each client the server has an XRC receive (TGT) QP and an XRC send (INI)
// QP; each client has one of each, connected to the server's pair. The
// server sends each client's messages through all of its send QPs in turn:
// a message to client k that leaves on the QP connected to client j's
// receive QP still lands on client k's SRQ, because the domain is shared
// and the message names the SRQ. Each client answers every message, and a
// final handshake over TCP keeps every receive QP alive until the last
// client has its messages. The sides exchange addresses over TCP in
// ibv_xsrq_pingpong's format, so either side can be the C tool.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	_ "github.com/xrcrun/xrc/mlx4"
	_ "github.com/xrcrun/xrc/softhca" // the soft driver: devices served by xrcrun hca
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
	mtu      verbs.MTU
	clients  int
	iters    int
	sl       int
	events   bool
	odp      bool
	gidIdx   int
	xrcdFile string
	server   string // the server's host, for a client; "" for the server
}

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("xsrq_pingpong", flag.ContinueOnError)
	fs.SetOutput(stderr)
	both := func(short, long string, def int, p *int, usage string) {
		fs.IntVar(p, short, def, usage)
		fs.IntVar(p, long, def, "same as -"+short)
	}
	var mtu int
	both("p", "port", 18515, &o.port, "listen on/connect to TCP port `port`")
	fs.StringVar(&o.dev, "d", "", "use device `dev` (default first device found)")
	fs.StringVar(&o.dev, "ib-dev", "", "same as -d")
	both("i", "ib-port", 1, &o.ibPort, "use `port` of the device")
	both("s", "size", 4096, &o.size, "size of message to exchange")
	both("m", "mtu", 1024, &mtu, "path MTU")
	both("c", "clients", 1, &o.clients, "number of clients (server only)")
	both("n", "num_tests", 5, &o.iters, "number of messages to and from each client")
	both("l", "sl", 0, &o.sl, "service level value")
	fs.BoolVar(&o.events, "e", false, "sleep on CQ events (default poll)")
	fs.BoolVar(&o.events, "events", false, "same as -e")
	fs.BoolVar(&o.odp, "o", false, "use on-demand paging (no device here has it)")
	fs.BoolVar(&o.odp, "odp", false, "same as -o")
	both("g", "gid-idx", -1, &o.gidIdx, "local port gid `index` (on Ethernet ports, 0 when not given)")
	fs.StringVar(&o.xrcdFile, "xrcd-file", "/tmp/xrc_domain", "the `file` whose XRC domain the processes of a node share (not in ibv_xsrq_pingpong)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage:\n  xsrq_pingpong            start a server and wait for connection\n  xsrq_pingpong <host>     connect to server at <host>\n\nOptions:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch fs.NArg() {
	case 0:
	case 1:
		o.server = fs.Arg(0)
		o.clients = 1 // a client is one of the server's clients
	default:
		fs.Usage()
		return nil, errors.New("xsrq_pingpong: at most one host")
	}
	m, err := verbs.MTUFromBytes(mtu)
	if err != nil {
		return nil, fmt.Errorf("xsrq_pingpong: -m %d: %w", mtu, err)
	}
	o.mtu = m
	switch {
	case o.port < 0 || o.port > 65535:
		return nil, fmt.Errorf("xsrq_pingpong: port %d out of range", o.port)
	case o.ibPort < 1 || o.ibPort > 255:
		return nil, fmt.Errorf("xsrq_pingpong: device port %d out of range", o.ibPort)
	case o.size < 1 || o.clients < 1 || o.iters < 1:
		return nil, errors.New("xsrq_pingpong: size, clients and num_tests must be positive")
	case o.sl < 0 || o.sl > 15:
		return nil, fmt.Errorf("xsrq_pingpong: service level %d out of range", o.sl)
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	if o.odp {
		return fmt.Errorf("xsrq_pingpong: -o: on-demand paging: %w", verbs.ErrNotSupported)
	}
	dev, err := verbs.Open(ctx, o.dev, verbs.Config{})
	if err != nil {
		return err
	}
	defer dev.Close()
	pp, err := newPingpong(dev, o, stderr)
	if err != nil {
		return errors.Join(err, pp.close())
	}
	err = pp.run(ctx, stdout)
	if err = errors.Join(err, pp.close()); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "success")
	return nil
}
