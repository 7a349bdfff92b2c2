// Package racedma tells the race detector about the synchronization a
// device's DMA has with its completions. An in-process device (softhca)
// copies into and out of Go memory from its engine goroutine; the program
// learns that the copy is done by polling a completion from queue memory
// that the race detector does not see. Release after a copy and Acquire
// after a poll that found completions give the detector that edge. Both
// are no-ops without the race detector.
package racedma
