//go:build linux

package softhca

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// RuntimeDirEnv is the environment variable that sets the directory where
// device services put their sockets, and where clients look for them.
const RuntimeDirEnv = "XRC_RUNTIME_DIR"

// RuntimeDir returns the directory of device sockets: $XRC_RUNTIME_DIR if
// set, else $XDG_RUNTIME_DIR/xrc, else /tmp/xrc-<uid>.
func RuntimeDir() string {
	if d := os.Getenv(RuntimeDirEnv); d != "" {
		return d
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "xrc")
	}
	return filepath.Join(os.TempDir(), "xrc-"+strconv.Itoa(os.Geteuid()))
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
