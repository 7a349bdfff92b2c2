// Command xrcrun is the xrc launcher and device tool.
//
//	xrcrun [flags] PROGRAM [ARGS]               run PROGRAM as the ranks of a job
//	xrcrun hca --name soft0 --addr 127.0.1.1   run a software HCA until stopped
//	xrcrun devices [-v -l -d DEV -i PORT]       list RDMA devices, as ibv_devinfo
//
// Run "xrcrun -h" for the launcher's flags and "xrcrun <command> -h" for a
// command's. docs/xrcrun.md describes the launcher.
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

	"github.com/xrcrun/xrc/softhca"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == guardCommand {
		os.Exit(runGuard()) // with no handlers: it ignores the signals below
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 4)
	// SIGHUP (the terminal or ssh session closed) ends the job as SIGTERM
	// does; unhandled, it killed the launcher without its cleanup.
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		cancel(signalCause{s})
		for s := range sigs {
			// A second signal ends the launcher at once (its agents then
			// end their ranks). Agents ignore it: the kernel may send their
			// parent-death signal more than once, as the launcher's threads
			// exit one by one.
			if len(os.Args) < 2 || os.Args[1] != "agent" {
				fmt.Fprintln(os.Stderr, "xrcrun: second signal; exiting now")
				removeTempDirs()
				softhca.RemoveSockets() // xrcrun hca's: a client must not find a dead device's socket
				os.Exit(signalCause{s}.ExitStatus())
			}
		}
	}()
	var stdout, stderr io.Writer = os.Stdout, os.Stderr
	if len(os.Args) > 1 && commands[os.Args[1]] == nil { // a launch, not a command
		// SIGUSR1, SIGUSR2, SIGTSTP and SIGCONT are forwarded to the
		// ranks, as mpirun does. The ranks lead process groups of their
		// own, which the terminal's SIGTSTP (Ctrl-Z) does not reach:
		// unhandled, it stopped xrcrun and the ranks ran on.
		fwd := make(chan os.Signal, 4)
		signal.Notify(fwd, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTSTP, syscall.SIGCONT)
		ctx = withForward(ctx, fwd)
		// A closed stdout or stderr (xrcrun ... | head -1) ends the job as
		// SIGINT does, with its cleanup: SIGPIPE, unhandled, killed the
		// launcher. Handled, it comes for writes to any broken pipe or
		// socket (a control connection whose agent died, too): what ends
		// the job is a write to stdout or stderr failing with EPIPE. The
		// commands keep the defaults: an agent whose launcher died (its
		// stderr is a pipe to the launcher) dies on its next log line, and
		// its ranks with it; hca and devices end on SIGUSR1 as programs do.
		pipe := make(chan os.Signal, 1)
		signal.Notify(pipe, syscall.SIGPIPE)
		go func() {
			for range pipe {
			}
		}()
		broken := func() { cancel(signalCause{syscall.SIGPIPE}) }
		stdout, stderr = &pipeWriter{w: os.Stdout, broken: broken}, &pipeWriter{w: os.Stderr, broken: broken}
	}
	err := run(ctx, os.Args[1:], stdout, stderr)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		// -h and --help printed the usage they were asked for: not a
		// failure (exit status 0, as for Go's flag package and mpirun).
		return
	}
	fmt.Fprintln(os.Stderr, "xrcrun:", err)
	var st interface{ ExitStatus() int }
	if errors.As(err, &st) {
		os.Exit(st.ExitStatus())
	}
	os.Exit(1)
}

// commands are xrcrun's subcommands; anything else is a program to launch.
var commands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	"hca":     runHCA,
	"devices": runDevices,
	"agent":   runAgent, // started by the launcher on each node
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
	if cmd, ok := commands[args[0]]; ok {
		return cmd(ctx, args[1:], stdout, stderr)
	}
	return runLaunch(ctx, args, stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: xrcrun [flags] PROGRAM [ARGS...]   run PROGRAM as the ranks of a job
       xrcrun <command> [flags]

commands:
  hca       run a software HCA (a device other processes on this machine use)
  devices   list RDMA devices and their attributes, as ibv_devinfo does (-v: more)

`)
	fs, _ := launchFlags(w)
	fmt.Fprintln(w, "launcher flags:")
	fs.PrintDefaults()
}

// pipeWriter calls broken when a write to w fails because its reader has
// gone (EPIPE).
type pipeWriter struct {
	w      *os.File
	broken func()
}

func (p *pipeWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	if errors.Is(err, syscall.EPIPE) {
		p.broken()
	}
	return n, err
}

// Fd lets the status line see whether w is a terminal.
func (p *pipeWriter) Fd() uintptr { return p.w.Fd() }

// underlying is w's *os.File when w is a pipeWriter, for a child process
// to write to directly.
func underlying(w io.Writer) io.Writer {
	if p, ok := w.(*pipeWriter); ok {
		return p.w
	}
	return w
}
