package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// resolveProgram turns the PROGRAM argument into what agents execute. A
// directory is a Go package, built once into a temporary directory (which
// cleanup removes); a file is made absolute; a bare name is looked up in
// PATH here, or on each host for remote jobs; an import path
// ("example.com/cmd/x") that is nothing else is built too.
func resolveProgram(ctx context.Context, prog string, remote bool, stderr io.Writer) (string, func(), error) {
	nothing := func() {}
	if st, err := os.Stat(prog); err == nil {
		if st.IsDir() {
			pkg := prog
			if !filepath.IsAbs(pkg) && !strings.HasPrefix(pkg, ".") {
				pkg = "./" + pkg
			}
			return buildProgram(ctx, pkg, stderr)
		}
		abs, err := filepath.Abs(prog)
		return abs, nothing, err
	}
	if !strings.Contains(prog, "/") {
		if remote {
			return prog, nothing, nil
		}
		path, err := exec.LookPath(prog)
		if err != nil {
			return "", nil, fmt.Errorf("program %q: %w", prog, err)
		}
		abs, err := filepath.Abs(path)
		return abs, nothing, err
	}
	if first, _, _ := strings.Cut(prog, "/"); strings.Contains(first, ".") && !strings.HasPrefix(prog, ".") {
		return buildProgram(ctx, prog, stderr)
	}
	return "", nil, fmt.Errorf("program %q: no such file, directory or Go package", prog)
}

// buildProgram builds the Go package pkg into a temporary directory.
func buildProgram(ctx context.Context, pkg string, stderr io.Writer) (string, func(), error) {
	gocmd, err := exec.LookPath("go")
	if err != nil {
		return "", nil, fmt.Errorf("build %s: a Go package needs the go command: %w", pkg, err)
	}
	dir, cleanup, err := makeTempDir("xrcrun-build-")
	if err != nil {
		return "", nil, fmt.Errorf("build %s: %w", pkg, err)
	}
	out := filepath.Join(dir, filepath.Base(strings.TrimRight(pkg, "/")))
	if b := filepath.Base(out); b == "." || b == ".." || b == "/" {
		out = filepath.Join(dir, "program")
	}
	cmd := exec.CommandContext(ctx, gocmd, "build", "-o", out, pkg)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		cleanup()
		if cerr := context.Cause(ctx); cerr != nil {
			err = cerr // a signal or the timeout ended the build: its exit status
		}
		return "", nil, fmt.Errorf("build %s: %w", pkg, err)
	}
	return out, cleanup, nil
}
