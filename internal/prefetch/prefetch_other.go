//go:build !amd64

package prefetch

// Addrs does nothing on this architecture.
func Addrs(a []uintptr) {}
