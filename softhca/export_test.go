package softhca_test

import "github.com/xrcrun/xrc/internal/unix"

func addrOf(b []byte) uintptr { return unix.AddrOf(b) }
