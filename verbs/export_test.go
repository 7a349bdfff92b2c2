package verbs

import "github.com/xrcrun/xrc/internal/unix"

func uintptrOf(b []byte) uintptr { return unix.AddrOf(b) }
