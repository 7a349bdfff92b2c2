//go:build race

package racedma

import (
	"runtime"
	"unsafe"
)

var token uint64

// Release marks a DMA copy as done, for a later Acquire.
func Release() { runtime.RaceReleaseMerge(unsafe.Pointer(&token)) }

// Acquire orders what follows after every Release so far.
func Acquire() { runtime.RaceAcquire(unsafe.Pointer(&token)) }
