package bootstrap

import (
	"bufio"
	"io"

	"github.com/prometheus/client_golang/prometheus"
)

// frameConn reads and writes frames on a stream and counts the bytes.
// Reads and writes may run concurrently with each other, not with
// themselves.
type frameConn struct {
	r       *bufio.Reader
	w       io.Writer
	in, out prometheus.Counter
}

func newFrameConn(rw io.ReadWriter, in, out prometheus.Counter) *frameConn {
	return &frameConn{r: bufio.NewReaderSize(rw, 16<<10), w: rw, in: in, out: out}
}

// read reads a frame of at most limit payload bytes; see readFrame.
func (f *frameConn) read(limit int) (msgType, []byte, error) {
	t, p, err := readFrame(f.r, limit)
	if err == nil {
		f.in.Add(float64(headerLen + len(p)))
	}
	return t, p, err
}

// write writes an encoded frame.
func (f *frameConn) write(frame []byte) error {
	n, err := f.w.Write(frame)
	f.out.Add(float64(n))
	return err
}

// send encodes and writes m.
func (f *frameConn) send(m message) error { return f.write(appendFrame(nil, m)) }
