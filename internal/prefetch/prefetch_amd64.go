package prefetch

// Addrs prefetches, into all cache levels, the line of each address in a.
//
//go:noescape
func Addrs(a []uintptr)
