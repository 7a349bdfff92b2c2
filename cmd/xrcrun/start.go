package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/xrcrun/xrc/bootstrap"
)

// startAgents starts one agent per node: as child processes on this
// machine, through ssh on each host, or with one srun for the nodes of a
// Slurm allocation. Agents connect back on their own; a process that exits
// first is reported to the loop.
func (j *job) startAgents(ctx context.Context, spec agentSpec) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("launcher: own path, to run agents: %w", err)
	}
	jobEnv := bootstrap.EnvJobID + "=" + j.id
	switch j.mode {
	case modeLocal:
		for k := range j.place.Nodes {
			spec.Node = k
			cmd := exec.Command(self, "agent")
			cmd.Env = append(os.Environ(), jobEnv)
			if err := j.launch(cmd, fmt.Sprintf("agent of node %d", k), []int{k}, &spec); err != nil {
				return err
			}
		}
	case modeSSH:
		for k, nd := range j.place.Nodes {
			spec.Node = k
			argv := sshCommand(j.cfg.ssh, nd.Host, []string{"env", jobEnv, self, "agent"})
			cmd := exec.Command(argv[0], argv[1:]...)
			if err := j.launch(cmd, "ssh "+nd.Host, []int{k}, &spec); err != nil {
				return err
			}
		}
	case modeSlurm:
		spec.Node = -1
		b, err := json.Marshal(spec)
		if err != nil {
			return err
		}
		hosts := make([]string, len(j.place.Nodes))
		all := make([]int, len(j.place.Nodes))
		for k, nd := range j.place.Nodes {
			hosts[k], all[k] = nd.Host, k
		}
		argv := srunCommand(hosts, []string{self, "agent"})
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), jobEnv, envAgentSpec+"="+string(b))
		j.log.Debug("srun", "args", argv)
		if err := j.launch(cmd, "srun", all, nil); err != nil {
			return err
		}
	}
	return nil
}

// launch starts cmd, which runs the agents of nodes: in a process group of
// its own (so that a Ctrl-C at the terminal reaches only the launcher, which
// ends the job in order), its output on the launcher's stderr, and spec, if
// any, on its stdin. If the launcher dies, cmd gets SIGTERM: an agent then
// kills its ranks' process groups (SIGKILL would leave what the ranks
// started), ssh and srun end their remote side.
func (j *job) launch(cmd *exec.Cmd, what string, nodes []int, spec *agentSpec) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	cmd.Stdout, cmd.Stderr = j.stderr, j.stderr
	if spec != nil {
		b, err := json.Marshal(spec)
		if err != nil {
			return err
		}
		cmd.Stdin = strings.NewReader(string(b) + "\n")
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("launcher: start %s: %w", what, err)
	}
	p := &launched{what: what, nodes: nodes, pid: cmd.Process.Pid}
	j.procs = append(j.procs, p)
	go func() {
		err := cmd.Wait()
		j.post(event{kind: evExited, proc: p, err: err})
	}()
	return nil
}
