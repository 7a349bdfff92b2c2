package main

import (
	"fmt"
	"io"

	"golang.org/x/term"
)

// statusLine is the one line xrcrun keeps up to date on a terminal while
// the job starts: nodes ready, ranks started, ranks joined at the
// rendezvous. It draws nothing when stderr is not a terminal, and goes away
// for good once every rank has joined. It is used by one goroutine.
type statusLine struct {
	w       io.Writer
	on      bool // drawing
	shown   bool // a line is on the screen
	last    string
	stopped bool
}

// newStatusLine draws on w if w is a terminal.
func newStatusLine(w io.Writer) *statusLine {
	f, ok := w.(interface{ Fd() uintptr }) // an *os.File, or main's pipeWriter
	return &statusLine{w: w, on: ok && term.IsTerminal(int(f.Fd()))}
}

// update redraws the line, if it changed.
func (s *statusLine) update(id string, ready, nodes, started, joined, size int) {
	if !s.on || s.stopped {
		return
	}
	if joined >= size {
		s.stop()
		return
	}
	line := fmt.Sprintf("xrcrun %s: nodes %d/%d ready, ranks %d/%d started, %d/%d connected", id, ready, nodes, started, size, joined, size)
	if s.shown && line == s.last {
		return
	}
	fmt.Fprintf(s.w, "\r\033[K%s", line)
	s.shown, s.last = true, line
}

// clear removes the line until the next update, for output to be written.
func (s *statusLine) clear() {
	if s.shown {
		fmt.Fprint(s.w, "\r\033[K")
		s.shown = false
	}
}

// stop removes the line for good.
func (s *statusLine) stop() {
	s.clear()
	s.stopped = true
}
