// Command rank is a test rank for xrcrun's tests: it prints what it learned
// from the launcher and then does what its flags say.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/xrcrun/xrc/bootstrap"
	_ "github.com/xrcrun/xrc/mlx4"
	_ "github.com/xrcrun/xrc/softhca" // the soft verbs driver
	"github.com/xrcrun/xrc/verbs"
)

func main() {
	exitRank := flag.Int("exit-rank", -1, "this rank exits with -code")
	code := flag.Int("code", 3, "exit status of -exit-rank")
	hang := flag.Bool("hang", false, "every rank (but -exit-rank) waits until killed")
	ignoreTerm := flag.Bool("ignore-term", false, "ignore SIGTERM")
	child := flag.Bool("child", false, "start a child process that sleeps, in the rank's process group")
	lines := flag.Int("lines", 1, "how many lines to print")
	join := flag.Bool("join", false, "join the job's rendezvous (bootstrap.FromEnv) and pass a barrier before exiting")
	open := flag.Bool("open", false, "open the node's device (XRC_DEVICE) and print its port's GID")
	usr := flag.Bool("usr", false, `print "rank R got SIGNAL" on SIGUSR1 and SIGUSR2`)
	flag.Parse()
	if *ignoreTerm {
		signal.Ignore(syscall.SIGTERM)
	}
	rank, _ := strconv.Atoi(os.Getenv("XRC_RANK"))
	if *usr {
		sigs := make(chan os.Signal, 4)
		signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
		go func() {
			for s := range sigs {
				fmt.Printf("rank %d got %v\n", rank, s)
			}
		}()
	}
	var client *bootstrap.Client
	if *join {
		c, _, err := bootstrap.FromEnv(context.Background(), bootstrap.ClientConfig{})
		if err != nil {
			fmt.Fprintf(os.Stderr, "rank %d: join: %v\n", rank, err)
			os.Exit(1)
		}
		client = c
	}
	for i := range *lines {
		fmt.Printf("rank %s of %s node %s/%s local %s/%s device %s dir %s pid %d line %d x=%s\n",
			os.Getenv("XRC_RANK"), os.Getenv("XRC_SIZE"), os.Getenv("XRC_NODE"), os.Getenv("XRC_NNODES"),
			os.Getenv("XRC_LOCAL_RANK"), os.Getenv("XRC_LOCAL_SIZE"), os.Getenv("XRC_DEVICE"),
			os.Getenv("XRC_RUNTIME_DIR"), os.Getpid(), i, os.Getenv("XRCRUN_TEST_X"))
	}
	fmt.Fprintf(os.Stderr, "stderr of rank %d transport %s connect %s\n", rank, os.Getenv("XRC_TRANSPORT"), os.Getenv("XRC_CONNECT"))
	if *open {
		if err := printGID(os.Getenv("XRC_DEVICE")); err != nil {
			fmt.Fprintf(os.Stderr, "rank %d: %v\n", rank, err)
			os.Exit(1)
		}
	}
	if *child {
		self, _ := os.Executable()
		_ = self
		p, err := os.StartProcess("/bin/sleep", []string{"sleep", "1000"}, &os.ProcAttr{Env: os.Environ()})
		if err == nil {
			fmt.Printf("child %d\n", p.Pid)
		}
	}
	if rank == *exitRank {
		time.Sleep(100 * time.Millisecond)
		os.Exit(*code)
	}
	if client != nil && !*hang {
		// Without -exit-rank every rank arrives; with it, the job is aborted
		// when that rank exits without leaving, and the barrier fails.
		if err := client.Barrier(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "rank %d: barrier: %v\n", rank, err)
			os.Exit(1)
		}
		client.Close()
		return
	}
	if *hang || *exitRank >= 0 {
		for {
			time.Sleep(time.Hour)
		}
	}
}

func printGID(name string) error {
	c, err := verbs.Open(context.Background(), name, verbs.Config{})
	if err != nil {
		return err
	}
	defer c.Close()
	p, err := c.QueryPort(1)
	if err != nil {
		return err
	}
	fmt.Printf("gid %s\n", p.GID)
	return nil
}
