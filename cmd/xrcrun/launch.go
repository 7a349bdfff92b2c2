package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/xrcrun/xrc/softhca"
)

// Environment variables the launcher reads.
const (
	envSSH  = "XRC_SSH"  // the ssh command for --hostfile and -H
	envSrun = "XRC_SRUN" // the srun command inside a Slurm allocation
)

// launchConfig is a job as the command line describes it.
type launchConfig struct {
	n         int
	nodes     int
	ppn       int
	byNode    bool
	hostfile  string
	hosts     string
	ssh       string
	env       envFlag
	tag       bool
	timeout   time.Duration
	transport string
	faults    softhca.Faults // injected in the soft HCAs of emulated nodes
	connect   string
	baseAddr  string
	addr      string
	grace     time.Duration
	agentWait time.Duration // how long node agents have to connect
	verbose   bool
	noSlurm   bool
	jobID     string
	program   string
	args      []string
}

// envFlag collects -x VAR[=value].
type envFlag []string

func (e *envFlag) String() string { return strings.Join(*e, ",") }
func (e *envFlag) Set(v string) error {
	name, _, _ := strings.Cut(v, "=")
	if name == "" || strings.ContainsAny(name, " \t\n\x00") {
		return fmt.Errorf("-x %q: not VAR or VAR=value", v)
	}
	*e = append(*e, v)
	return nil
}

// resolve turns -x entries into NAME=value, taking values not given from
// getenv; names not set anywhere are left out, and listed in missing.
func (e envFlag) resolve(getenv func(string) (string, bool)) (out, missing []string) {
	for _, v := range e {
		if strings.Contains(v, "=") {
			out = append(out, v)
		} else if val, ok := getenv(v); ok {
			out = append(out, v+"="+val)
		} else {
			missing = append(missing, v)
		}
	}
	return out, missing
}

func launchFlags(stderr io.Writer) (*flag.FlagSet, *launchConfig) {
	c := &launchConfig{}
	fs := flag.NewFlagSet("xrcrun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.n, "n", 0, "the number of ranks (default: --ppn on every node, else the slots of --hostfile/-H, else SLURM_NTASKS in an allocation, else one per node)")
	fs.IntVar(&c.nodes, "nodes", 0, "emulate `K` nodes on this machine: a node agent and soft HCA each, on its own loopback address")
	fs.IntVar(&c.ppn, "ppn", 0, "ranks per node, placed in blocks (default: the nodes' slots, else an even share)")
	fs.String("map-by", "slot", "`slot`: consecutive ranks fill a node before the next; node: round robin over the nodes")
	fs.StringVar(&c.hostfile, "hostfile", "", "run on the hosts listed in `file` (host [slots=N] per line), reached with ssh")
	fs.StringVar(&c.hosts, "H", "", "run on these `hosts` (h1,h2:slots,…), reached with ssh")
	fs.StringVar(&c.ssh, "ssh", os.Getenv(envSSH), "the ssh `command` for --hostfile and -H, split at spaces (default: $"+envSSH+", else ssh)")
	fs.Var(&c.env, "x", "pass `VAR` (from this environment) or VAR=value to every rank; repeatable")
	fs.BoolVar(&c.tag, "tag-output", false, "prefix every line of output with [rank]")
	fs.Var(seconds{&c.timeout}, "timeout", "end the job after `duration` (10s, 5m, 1h30m; a plain number is seconds, as mpirun's), exit status 124; 0: no limit")
	fs.StringVar(&c.transport, "transport", "auto", "the ranks' transport: rc, xrc or auto (XRC_TRANSPORT)")
	fs.StringVar(&c.connect, "connect", "lazy", "when ranks connect: eager (all at start) or lazy (at the first message; XRC_CONNECT)")
	fs.StringVar(&c.baseAddr, "base-addr", "", "node K's soft HCA on this machine (--nodes, or a job's one node) listens on this `IPv4` address plus K, taken or not (default: 127.0.1.1 plus K if free, else free loopback addresses)")
	fs.StringVar(&c.addr, "addr", "", "the `address` agents and ranks reach the launcher at (default: 127.0.0.1 on one machine, else the address of the route to the first host)")
	c.grace = 3 * time.Second
	fs.Var(seconds{&c.grace}, "grace", "how long ranks have between SIGTERM and SIGKILL when the job ends early (a plain number is seconds)")
	c.agentWait = -1 // 1m with ssh, no limit under Slurm (launchConfig.agentTimeout)
	fs.Var(seconds{&c.agentWait}, "agent-timeout", "fail the job if a node agent has not connected to the launcher this long after it was started (ssh could not reach its host, or waits for an answer); default 1m, none under Slurm (srun may wait for the step's resources); 0: no limit")
	fs.BoolVar(&c.verbose, "v", false, "log what the launcher and agents do")
	fs.Float64Var(&c.faults.Loss, "loss", 0, "fault injection in the soft HCAs the job starts: probability that a sent packet is dropped")
	fs.Float64Var(&c.faults.Duplicate, "dup", 0, "fault injection: probability that a sent packet is duplicated")
	fs.Float64Var(&c.faults.Reorder, "reorder", 0, "fault injection: probability that a sent packet is held back behind the next")
	fs.Uint64Var(&c.faults.Seed, "seed", 1, "fault injection: the seed (node K's soft HCA uses seed+K)")
	fs.BoolVar(&c.noSlurm, "no-slurm", false, "ignore a Slurm allocation: run on this machine")
	fs.StringVar(&c.jobID, "job-id", "", "the job's `name` (XRC_JOB_ID; letters, digits, - and _, at most 32; default: random)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: xrcrun [flags] PROGRAM [ARGS...]

Runs PROGRAM as the ranks of a job: on this machine (one node, or --nodes
emulated nodes), on the hosts of --hostfile or -H (ssh), or on the nodes of
the Slurm allocation it runs in (srun). PROGRAM may be a Go package
directory (./examples/hello), built once before the launch.

flags:
`)
		fs.PrintDefaults()
	}
	return fs, c
}

// parseFlags parses the flags of the launcher or of a subcommand: -h prints
// the usage and returns flag.ErrHelp; a bad flag or value is one line of
// error, which main prints, not the whole usage.
func parseFlags(fs *flag.FlagSet, args []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Usage = usage
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage()
		return err
	case err != nil:
		return fmt.Errorf("%w (%s -h lists the flags)", err, fs.Name())
	}
	return nil
}

// parseLaunch reads the launcher's command line.
func parseLaunch(args []string, stderr io.Writer) (*launchConfig, error) {
	fs, c := launchFlags(stderr)
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	switch m := fs.Lookup("map-by").Value.String(); m {
	case "slot", "core":
	case "node":
		c.byNode = true
	default:
		return nil, fmt.Errorf("--map-by %q: slot or node", m)
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return nil, errors.New("no program to run")
	}
	c.program, c.args = fs.Arg(0), fs.Args()[1:]
	switch {
	case c.n < 0:
		return nil, fmt.Errorf("-n %d: the number of ranks must be positive", c.n)
	case c.nodes < 0 || c.ppn < 0:
		return nil, errors.New("--nodes and --ppn must be positive")
	case c.nodes > 0 && (c.hostfile != "" || c.hosts != ""):
		return nil, errors.New("--nodes emulates nodes on this machine; it does not go with --hostfile or -H")
	case c.hostfile != "" && c.hosts != "":
		return nil, errors.New("give --hostfile or -H, not both")
	case c.timeout < 0 || c.grace < 0 || c.agentWait < 0 && c.agentWait != -1:
		return nil, errors.New("--timeout, --grace and --agent-timeout must not be negative")
	}
	if err := checkFaults(c.faults); err != nil {
		return nil, err
	}
	if !oneOf(c.transport, "rc", "xrc", "auto") {
		return nil, fmt.Errorf("--transport %q: rc, xrc or auto", c.transport)
	}
	if !oneOf(c.connect, "eager", "lazy") {
		return nil, fmt.Errorf("--connect %q: eager or lazy", c.connect)
	}
	if c.jobID != "" && (len(c.jobID) > 32 || strings.Trim(c.jobID, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "") {
		return nil, fmt.Errorf("--job-id %q: at most 32 letters, digits, - and _", c.jobID)
	}
	if c.baseAddr != "" {
		a, err := netip.ParseAddr(c.baseAddr)
		if err != nil || !a.Is4() {
			return nil, fmt.Errorf("--base-addr %q: not an IPv4 address", c.baseAddr)
		}
	}
	return c, nil
}

// agentTimeout is how long the node agents of a launch in mode have to
// connect: --agent-timeout, else a minute, but no limit under Slurm, where
// srun may wait for its step's resources for as long as they are busy,
// and says so itself.
func (c *launchConfig) agentTimeout(mode launchMode) time.Duration {
	switch {
	case c.agentWait >= 0:
		return c.agentWait
	case mode == modeSlurm:
		return 0
	}
	return time.Minute
}

// seconds is a duration flag that also takes a plain number of seconds
// ("10", "2.5"), as mpirun's --timeout does.
type seconds struct{ d *time.Duration }

func (s seconds) String() string {
	if s.d == nil || *s.d < 0 { // unset: the flag's usage says what applies
		return "0s"
	}
	return s.d.String()
}

func (s seconds) Set(v string) error {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if math.IsNaN(f) || f < 0 || f > math.MaxInt64/float64(time.Second) {
			return fmt.Errorf("%s: not a number of seconds", v)
		}
		*s.d = time.Duration(f * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return errors.New("not a duration: give seconds (10) or a number with a unit (10s, 5m, 1h30m)")
	}
	*s.d = d
	return nil
}

func oneOf(s string, set ...string) bool {
	for _, v := range set {
		if s == v {
			return true
		}
	}
	return false
}

// runLaunch is `xrcrun [flags] PROGRAM [ARGS]`.
func runLaunch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseLaunch(args, stderr)
	if err != nil {
		return err
	}
	level := slog.LevelWarn
	if c.verbose {
		level = slog.LevelDebug
	}
	logw := &logWriter{w: stderr}
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: level}))
	mode, nodes, err := c.where(os.Getenv)
	if err != nil {
		return err
	}
	p, err := layout(c.n, nodes, c.ppn, c.byNode)
	if err != nil {
		return err
	}
	id, key := newJobID()
	if c.jobID != "" {
		id = c.jobID
	}
	log = log.With("job", id)
	prog, cleanup, err := resolveProgram(ctx, c.program, mode != modeLocal, stderr)
	if err != nil {
		return err
	}
	defer cleanup()
	j := &job{cfg: c, mode: mode, id: id, key: key, place: p, program: prog, log: log, logw: logw, stdout: stdout, stderr: stderr}
	return j.run(ctx)
}

// The ways a job reaches its nodes.
type launchMode int

const (
	modeLocal launchMode = iota // this machine: one node, or --nodes emulated ones
	modeSSH                     // --hostfile, -H
	modeSlurm                   // the Slurm allocation xrcrun runs in
)

// where decides where the job runs and on which nodes.
func (c *launchConfig) where(getenv func(string) string) (launchMode, []node, error) {
	switch {
	case c.hostfile != "":
		f, err := os.Open(c.hostfile)
		if err != nil {
			return 0, nil, fmt.Errorf("hostfile: %w", err)
		}
		defer f.Close()
		nodes, err := parseHostfile(f)
		return modeSSH, nodes, err
	case c.hosts != "":
		nodes, err := parseHosts(c.hosts)
		return modeSSH, nodes, err
	case c.nodes > 0:
		return modeLocal, make([]node, c.nodes), nil
	}
	if !c.noSlurm {
		a, ok, err := slurmFromEnv(getenv)
		if err != nil {
			return 0, nil, err
		}
		if ok {
			if c.n == 0 && c.ppn == 0 && a.Tasks > 0 {
				c.n = a.Tasks // with --ppn, layout puts ppn on every node
			}
			return modeSlurm, a.Nodes, nil
		}
	}
	return modeLocal, make([]node, 1), nil
}

// layout places the job's n ranks on nodes. Without -n (n 0, and in a
// Slurm allocation no SLURM_NTASKS) the job is ppn ranks on every node
// with --ppn, else every node's slots, one for a node whose slots are not
// given; and a node without slots holds the one rank it was counted for:
// else --map-by node, which never finds such a node full, dealt it ranks
// meant for the nodes with slots (-H a,b:3 put ranks 0 and 2 on a). With
// -n and without --ppn (which limits every node), a node without slots
// takes any number.
func layout(n int, nodes []node, ppn int, byNode bool) (placement, error) {
	if n == 0 {
		counted := make([]node, len(nodes))
		for i, nd := range nodes {
			nd.Slots = max(nd.Slots, 1)
			counted[i] = nd
			if ppn > 0 {
				n += ppn
			} else {
				n += nd.Slots
			}
		}
		nodes = counted
	}
	return place(n, nodes, ppn, byNode)
}

// newJobID returns a random job name and key.
func newJobID() (string, []byte) {
	b := make([]byte, 4+32)
	rand.Read(b)
	return hex.EncodeToString(b[:4]), b[4:]
}

// logWriter is where the launcher's log goes: stderr, and while the job
// runs the job's output writer (queueWriter), in order with the ranks'
// output and never holding up the loop that logs.
type logWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *logWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	w := l.w
	l.mu.Unlock()
	return w.Write(b)
}

func (l *logWriter) set(w io.Writer) {
	l.mu.Lock()
	l.w = w
	l.mu.Unlock()
}
