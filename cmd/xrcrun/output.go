package main

import (
	"bytes"
	"io"
	"strconv"
)

// maxLineLen bounds what the launcher holds of a rank's unfinished line.
const maxLineLen = 64 << 10

// output writes the ranks' output to the launcher's stdout and stderr a
// whole line at a time, so that lines of different ranks never mix, each
// prefixed with "[rank] " under --tag-output. It is used by one goroutine.
type output struct {
	w       [3]io.Writer // [1] stdout, [2] stderr
	tag     bool
	before  func() // called before anything is written (clears the status line)
	partial map[[2]int][]byte
}

func newOutput(stdout, stderr io.Writer, tag bool, before func()) *output {
	return &output{w: [3]io.Writer{nil, stdout, stderr}, tag: tag, before: before, partial: map[[2]int][]byte{}}
}

// write takes a piece of what rank wrote on stream (1 or 2) and writes
// the lines it completes.
func (o *output) write(rank, stream int, data []byte) {
	if stream != 1 && stream != 2 {
		stream = 2
	}
	k := [2]int{rank, stream}
	buf := append(o.partial[k], data...)
	end := bytes.LastIndexByte(buf, '\n')
	if end < 0 && len(buf) >= maxLineLen { // a line without end: pass it on in pieces
		o.emit(rank, stream, append(buf, '\n'))
		delete(o.partial, k)
		return
	}
	if end < 0 {
		o.partial[k] = buf
		return
	}
	o.emit(rank, stream, buf[:end+1])
	if rest := buf[end+1:]; len(rest) > 0 {
		o.partial[k] = append([]byte(nil), rest...)
	} else {
		delete(o.partial, k)
	}
}

// flush writes what rank left without a final newline, ending the line.
func (o *output) flush(rank int) {
	for stream := 1; stream <= 2; stream++ {
		k := [2]int{rank, stream}
		if b := o.partial[k]; len(b) > 0 {
			o.emit(rank, stream, append(b, '\n'))
		}
		delete(o.partial, k)
	}
}

func (o *output) emit(rank, stream int, lines []byte) {
	if o.before != nil {
		o.before()
	}
	if !o.tag {
		o.w[stream].Write(lines)
		return
	}
	prefix := []byte("[" + strconv.Itoa(rank) + "] ")
	var b bytes.Buffer
	for len(lines) > 0 {
		i := bytes.IndexByte(lines, '\n')
		b.Write(prefix)
		b.Write(lines[:i+1])
		lines = lines[i+1:]
	}
	o.w[stream].Write(b.Bytes())
}
