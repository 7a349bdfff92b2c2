// Command xrcrun is the xrc launcher and device tool.
//
//	xrcrun hca --name soft0 --addr 127.0.1.1   run a software HCA until stopped
//	xrcrun devices [-v]                          list RDMA devices, as ibv_devinfo
//
// Run "xrcrun <command> -h" for a command's flags.
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
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "xrcrun:", err)
		}
		os.Exit(1)
	}
}

// commands are xrcrun's subcommands.
var commands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	"hca":     runHCA,
	"devices": runDevices,
}

// run is xrcrun without the process around it: tests call it directly.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return errors.New("no command")
		}
		return flag.ErrHelp
	}
	cmd, ok := commands[args[0]]
	if !ok {
		usage(stderr)
		return fmt.Errorf("unknown command %q", args[0])
	}
	return cmd(ctx, args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: xrcrun <command> [flags]

commands:
  hca       run a software HCA (a device other processes on this machine use)
  devices   list RDMA devices and their attributes, as ibv_devinfo does (-v: more)
`)
}
