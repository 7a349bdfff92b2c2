package softhca_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca/hcatest"
	"github.com/xrcrun/xrc/verbs"
)

// objects makes one of every kind of object on c (a completion channel,
// a PD, a CQ, an SRQ, an RC QP, memory regions on Alloc and on Go memory,
// an XRC domain with an XRC SRQ and an INI QP) and returns them in the
// order they are to be closed.
func objects(t *testing.T, c *verbs.Context) []io.Closer {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	ch, err := c.CreateCompChannel()
	must(err)
	pd, err := c.AllocPD()
	must(err)
	cq, err := c.CreateCQ(64, ch, 0)
	must(err)
	srq, err := pd.CreateSRQ(verbs.SRQAttr{MaxWR: 16, MaxSGE: 1})
	must(err)
	qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTRC, SendCQ: cq, RecvCQ: cq, SRQ: srq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxSendSGE: 1}})
	must(err)
	buf, err := verbs.Alloc(1 << 16)
	must(err)
	t.Cleanup(func() { verbs.Free(buf) })
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	must(err)
	gomr, err := pd.RegMR(make([]byte, 4096), verbs.AccessLocalWrite)
	must(err)
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "xrcd"), os.O_RDWR|os.O_CREATE, 0o600)
	must(err)
	defer f.Close()
	xrcd, err := c.OpenXRCD(f, os.O_CREATE)
	must(err)
	xsrq, err := pd.CreateXRCSRQ(xrcd, cq, verbs.SRQAttr{MaxWR: 16, MaxSGE: 1})
	must(err)
	ini, err := pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTXRCIni, SendCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxSendSGE: 1}})
	must(err)
	return []io.Closer{ini, xsrq, xrcd, qp, srq, mr, gomr, cq, ch, pd}
}

// closeGone closes objs and then c, whose device is gone: every close
// succeeds, freeing what the client holds, as rdma-core lets a process
// destroy its objects after IBV_EVENT_DEVICE_FATAL.
func closeGone(t *testing.T, c *verbs.Context, objs []io.Closer) {
	t.Helper()
	for _, o := range objs {
		if err := o.Close(); err != nil {
			t.Errorf("close %T on a device that is gone: %v", o, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Errorf("close the context of a device that is gone: %v", err)
	}
}

// waitFatal waits for c's IBV_EVENT_DEVICE_FATAL.
func waitFatal(t *testing.T, c *verbs.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		ev, err := c.GetAsyncEvent(ctx)
		if err != nil {
			t.Fatalf("waiting for DEVICE_FATAL: %v", err)
		}
		if ev.Type == verbs.EventDeviceFatal {
			return
		}
	}
}

// TestCloseAfterDeviceGone: the objects of a context whose in-process
// device closed under them are destroyed without error, and so is the
// context. Before, every destroy failed with EIO ("device or client
// closed"), the client's queue memory stayed mapped, and the context
// refused to close with its objects still open. While the device lives,
// a context with objects open still refuses (EBUSY).
func TestCloseAfterDeviceGone(t *testing.T) {
	d := newDevice(t, nil)
	c, err := d.Open(verbs.Config{})
	if err != nil {
		t.Fatal(err)
	}
	objs := objects(t, c)
	if err := c.Close(); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("close a context with objects open on a live device: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	waitFatal(t, c)
	closeGone(t, c, objs)
}

// TestCloseAfterServiceGone is TestCloseAfterDeviceGone for a device in
// another process (softhca.Attach) that stops.
func TestCloseAfterServiceGone(t *testing.T) {
	s := hcatest.Start(t, t.TempDir())
	c := s.Open(t)
	objs := objects(t, c)
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFatal(t, c)
	// The device's process exits once it has told its clients.
	sock := filepath.Join(s.Dir, s.Name+".sock")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(sock); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the device's socket is still there 10 s after SIGTERM")
		}
	}
	closeGone(t, c, objs)
}
