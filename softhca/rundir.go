//go:build linux

package softhca

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// RuntimeDirEnv is the environment variable that sets the directory where
// device services put their sockets, and where clients look for them.
const RuntimeDirEnv = "XRC_RUNTIME_DIR"

// RuntimeDir returns the directory of device sockets: $XRC_RUNTIME_DIR if
// set, else $XDG_RUNTIME_DIR/xrc, else xrc-<uid> in the temporary directory
// ($TMPDIR, else /tmp).
func RuntimeDir() string {
	if d := os.Getenv(RuntimeDirEnv); d != "" {
		return d
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "xrc")
	}
	return filepath.Join(os.TempDir(), "xrc-"+strconv.Itoa(os.Geteuid()))
}

// checkRuntimeDir refuses a directory that another user could have made
// or could change: one not owned by this user or root, or writable by
// others without the sticky bit (which keeps them from replacing this
// user's socket). /tmp/xrc-UID, for one, may have been made by anyone.
func checkRuntimeDir(dir string) error {
	fi, err := os.Stat(dir) // where the socket lands: a symbolic link's target
	if err != nil {
		return fmt.Errorf("softhca: runtime directory: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("softhca: runtime directory %s is not a directory", dir)
	case !ok:
		return nil
	case int(st.Uid) != os.Geteuid() && st.Uid != 0:
		return fmt.Errorf("softhca: runtime directory %s belongs to user %d, not to this user (%d); set %s to a directory of your own", dir, st.Uid, os.Geteuid(), RuntimeDirEnv)
	case fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0:
		return fmt.Errorf("softhca: runtime directory %s may be written by other users (mode %v); set %s to a directory of your own", dir, fi.Mode().Perm(), RuntimeDirEnv)
	}
	return nil
}

const socketSuffix = ".sock"

// socketPath is where the device called name listens.
func socketPath(dir, name string) (string, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return "", fmt.Errorf("softhca: %q is not a device name", name)
	}
	p := filepath.Join(dir, name+socketSuffix)
	if len(p) >= 108 { // sizeof(sockaddr_un.sun_path)
		return "", fmt.Errorf("softhca: socket path %s is longer than a unix socket address allows; set %s to a shorter directory", p, RuntimeDirEnv)
	}
	return p, nil
}

// serviceNames lists the names of the devices whose sockets are in dir.
func serviceNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), socketSuffix); ok && e.Type()&os.ModeSocket != 0 {
			names = append(names, n)
		}
	}
	return names, nil
}
