package bootstrap

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
)

// The environment the launcher gives each rank (design D7).
const (
	EnvRank      = "XRC_RANK"       // this rank, 0..size-1
	EnvSize      = "XRC_SIZE"       // the number of ranks
	EnvLocalRank = "XRC_LOCAL_RANK" // this rank's index among the ranks of its node
	EnvLocalSize = "XRC_LOCAL_SIZE" // the number of ranks on this rank's node
	EnvNode      = "XRC_NODE"       // this rank's node, 0..nodes-1
	EnvNodes     = "XRC_NNODES"     // the number of nodes
	EnvAddr      = "XRC_BOOTSTRAP"  // the rendezvous server, host:port
	EnvKey       = "XRC_JOB_KEY"    // the job's key, hex
	EnvJobID     = "XRC_JOB_ID"     // the job's name, for logs and runtime files
	EnvTransport = "XRC_TRANSPORT"  // rc, xrc or auto
	EnvConnect   = "XRC_CONNECT"    // eager or lazy
	EnvDevice    = "XRC_DEVICE"     // the verbs device ranks on this node use; empty: the first
)

// Env is what a rank learns from its launcher.
type Env struct {
	Rank, Size           int
	LocalRank, LocalSize int
	Node, Nodes          int
	Addr                 string // the rendezvous server; empty for a world of one
	Key                  []byte
	JobID                string
	Transport            string
	Connect              string
	Device               string
}

// ErrEnv reports an environment that a launcher did not set up correctly.
var ErrEnv = errors.New("bootstrap: bad launcher environment")

// Environ returns e as NAME=value strings, for a rank's environment.
func (e Env) Environ() []string {
	return []string{
		EnvRank + "=" + strconv.Itoa(e.Rank),
		EnvSize + "=" + strconv.Itoa(e.Size),
		EnvLocalRank + "=" + strconv.Itoa(e.LocalRank),
		EnvLocalSize + "=" + strconv.Itoa(e.LocalSize),
		EnvNode + "=" + strconv.Itoa(e.Node),
		EnvNodes + "=" + strconv.Itoa(e.Nodes),
		EnvAddr + "=" + e.Addr,
		EnvKey + "=" + hex.EncodeToString(e.Key),
		EnvJobID + "=" + e.JobID,
		EnvTransport + "=" + e.Transport,
		EnvConnect + "=" + e.Connect,
		EnvDevice + "=" + e.Device,
	}
}

// ReadEnv reads the launcher's environment through getenv (os.Getenv if
// nil). Without EnvAddr it returns a world of one: rank 0 of 1 on node 0.
// The numbers must be consistent (rank < size, local rank < local size,
// node < nodes) and the key must be hex; otherwise the error wraps ErrEnv
// and names the variable.
func ReadEnv(getenv func(string) string) (Env, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	e := Env{Size: 1, LocalSize: 1, Nodes: 1, Transport: getenv(EnvTransport), Connect: getenv(EnvConnect),
		Device: getenv(EnvDevice), JobID: getenv(EnvJobID)}
	if e.Addr = getenv(EnvAddr); e.Addr == "" {
		return e, nil
	}
	num := func(name string, min int) (int, error) {
		v, err := strconv.Atoi(getenv(name))
		if err != nil || v < min {
			return 0, fmt.Errorf("%w: %s=%q", ErrEnv, name, getenv(name))
		}
		return v, nil
	}
	var errs []error
	for _, f := range []struct {
		name string
		min  int
		dst  *int
	}{
		{EnvRank, 0, &e.Rank}, {EnvSize, 1, &e.Size},
		{EnvLocalRank, 0, &e.LocalRank}, {EnvLocalSize, 1, &e.LocalSize},
		{EnvNode, 0, &e.Node}, {EnvNodes, 1, &e.Nodes},
	} {
		v, err := num(f.name, f.min)
		errs = append(errs, err)
		*f.dst = v
	}
	if err := errors.Join(errs...); err != nil {
		return Env{}, err
	}
	switch {
	case e.Rank >= e.Size:
		return Env{}, fmt.Errorf("%w: %s=%d is not below %s=%d", ErrEnv, EnvRank, e.Rank, EnvSize, e.Size)
	case e.LocalRank >= e.LocalSize:
		return Env{}, fmt.Errorf("%w: %s=%d is not below %s=%d", ErrEnv, EnvLocalRank, e.LocalRank, EnvLocalSize, e.LocalSize)
	case e.Node >= e.Nodes:
		return Env{}, fmt.Errorf("%w: %s=%d is not below %s=%d", ErrEnv, EnvNode, e.Node, EnvNodes, e.Nodes)
	}
	key, err := hex.DecodeString(getenv(EnvKey))
	if err != nil || len(key) < 16 {
		return Env{}, fmt.Errorf("%w: %s must be at least 16 bytes in hex", ErrEnv, EnvKey)
	}
	e.Key = key
	return e, nil
}
