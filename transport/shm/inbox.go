package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/xrcrun/xrc/internal/unix"
	"github.com/xrcrun/xrc/transport"
)

// An inbox is a file (on tmpfs: /dev/shm or the runtime directory) that a
// rank creates and maps, and that the other ranks of its node map to send
// to it: a header page, then one ring per sender.
//
//	+0    magic "XRCSHMv1", senders (u32), ring data size (u32), owner pid (u32)
//	+64   bell: a futex word the owner sleeps on; senders bump and wake it
//	+128  sleeping: non-zero while the owner is, or is about to be, asleep
//	+4096 ring 0, ring 1, ... (ringBytes(data) each)
//
// The owner alone creates, sizes and removes the file; senders only map it,
// after checking its header and size.
const (
	inboxHdr  = 4096
	bellOff   = 64
	sleepOff  = 128
	inboxVers = "XRCSHMv1"
)

// ErrLayout reports an inbox file whose header or size is not what a
// sender expects.
var ErrLayout = errors.New("shm: inbox file has the wrong layout")

func inboxBytes(senders, data int) int { return inboxHdr + senders*ringBytes(data) }

func checkRingData(data int) error {
	if data < minRingData || data&(data-1) != 0 || data > 1<<30 {
		return fmt.Errorf("shm: ring data size %d: want a power of two from %d to 1 GiB", data, minRingData)
	}
	return nil
}

func bell(b []byte) *atomic.Uint32     { return (*atomic.Uint32)(unsafe.Pointer(&b[bellOff])) }
func sleeping(b []byte) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&b[sleepOff])) }

// Inbox is the receiving side: the owner's mapping of its inbox file. One
// goroutine uses it at a time; Kick may be called from any goroutine.
type Inbox struct {
	path  string
	mem   []byte // the mapping; the Inbox owns it until Close
	rings []*Consumer
	bell  *atomic.Uint32
	sleep *atomic.Uint32
	// kmu orders Kick, which other goroutines call, before Close's unmap:
	// a Kick after Close does nothing (it wrote to unmapped memory).
	kmu    sync.RWMutex
	closed bool // guarded by kmu
}

// CreateInbox creates the inbox file at path (which must not exist) with a
// ring of data bytes for each of senders senders, and maps it. The file
// appears at path complete, header and all.
func CreateInbox(path string, senders, data int) (*Inbox, error) {
	if err := checkRingData(data); err != nil {
		return nil, err
	}
	if senders < 1 || senders > 4096 {
		return nil, fmt.Errorf("shm: %d senders: want 1 to 4096", senders)
	}
	// The file is made under a temporary name and linked into place when
	// its header is written, so that a sender never maps half of it.
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shm: create inbox: %w", err)
	}
	defer os.Remove(tmp)
	defer f.Close()
	size := inboxBytes(senders, data)
	if err := f.Truncate(int64(size)); err != nil {
		return nil, fmt.Errorf("shm: size inbox: %w", err)
	}
	mem, err := unix.MmapShared(int(f.Fd()), 0, size)
	if err != nil {
		return nil, fmt.Errorf("shm: map inbox %s: %w", path, err)
	}
	copy(mem, inboxVers)
	binary.LittleEndian.PutUint32(mem[8:], uint32(senders))
	binary.LittleEndian.PutUint32(mem[12:], uint32(data))
	binary.LittleEndian.PutUint32(mem[16:], uint32(os.Getpid()))
	if err := os.Link(tmp, path); err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("shm: create inbox: %w", err)
	}
	in := &Inbox{path: path, mem: mem, bell: bell(mem), sleep: sleeping(mem)}
	for i := range senders {
		off := inboxHdr + i*ringBytes(data)
		in.rings = append(in.rings, NewConsumer(mem[off:off+ringBytes(data)]))
	}
	return in, nil
}

// Ring returns the consumer of sender i's ring.
func (in *Inbox) Ring(i int) *Consumer { return in.rings[i] }

// Senders is the number of rings.
func (in *Inbox) Senders() int { return len(in.rings) }

// Pending reports whether any ring may hold a frame.
func (in *Inbox) Pending() bool {
	for _, c := range in.rings {
		if c.Pending() {
			return true
		}
	}
	return false
}

// Wait sleeps until a sender rings the bell, Kick is called, or d passes
// (d <= 0: no limit), unless a frame is pending already. Senders only ring
// the bell while the owner sleeps, so a busy inbox costs them nothing.
func (in *Inbox) Wait(d time.Duration) error { return in.WaitFrom(in.Seq(), d) }

// Seq is the bell's count of rings: a caller that reads it before it looks
// for work and passes it to WaitFrom misses no Kick that came in between.
func (in *Inbox) Seq() uint32 { return in.bell.Load() }

// WaitFrom is Wait that also returns at once if the bell has rung since
// it read seq (Seq).
func (in *Inbox) WaitFrom(seq uint32, d time.Duration) error {
	v := seq
	in.sleep.Store(1)
	var err error
	if !in.Pending() {
		err = unix.FutexWait(in.bell, v, d)
	}
	in.sleep.Store(0)
	return err
}

// Spin polls the rings for up to d and reports whether a frame came: what
// a rank does before Wait, since a sleep and a wake-up cost microseconds
// while a frame from a running peer takes a fraction of one.
func (in *Inbox) Spin(d time.Duration) bool {
	start := time.Now()
	for i := 0; ; i++ {
		if in.Pending() {
			return true
		}
		if i&63 == 63 && time.Since(start) >= d {
			return false
		}
	}
}

// Kick wakes the owner if it sleeps in Wait: for wake-ups that come from
// elsewhere in its own process (a completion channel, a timer).
func (in *Inbox) Kick() error {
	in.kmu.RLock()
	defer in.kmu.RUnlock()
	if in.closed {
		return nil
	}
	in.bell.Add(1)
	return unix.FutexWake(in.bell, 1)
}

// Close unmaps the inbox and removes its file. Senders that still map it
// keep their mapping; nobody reads it any more.
func (in *Inbox) Close() error {
	in.kmu.Lock()
	defer in.kmu.Unlock()
	in.closed = true
	err := os.Remove(in.path)
	if e := unix.Munmap(in.mem); e != nil {
		err = errors.Join(err, e)
	}
	in.mem, in.rings = nil, nil
	return err
}

// Outbox is a sender's mapping of another rank's inbox: its own ring there
// and the bell. One goroutine uses it at a time.
type Outbox struct {
	mem   []byte
	ring  *Producer
	bell  *atomic.Uint32
	sleep *atomic.Uint32
	owner int // the inbox owner's pid, as its header says
}

// OpenOutbox maps the inbox file at path as sender number sender, after
// checking that its header and size agree with each other.
func OpenOutbox(path string, sender int) (*Outbox, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: open inbox: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("shm: open inbox: %w", err)
	}
	var hdr [20]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrLayout, path, err)
	}
	senders := int(binary.LittleEndian.Uint32(hdr[8:]))
	data := int(binary.LittleEndian.Uint32(hdr[12:]))
	switch {
	case !bytes.Equal(hdr[:8], []byte(inboxVers)):
		return nil, fmt.Errorf("%w: %s: magic %q", ErrLayout, path, hdr[:8])
	case checkRingData(data) != nil || senders < 1 || senders > 4096:
		return nil, fmt.Errorf("%w: %s: %d senders, rings of %d bytes", ErrLayout, path, senders, data)
	case st.Size() != int64(inboxBytes(senders, data)):
		return nil, fmt.Errorf("%w: %s: %d bytes, want %d", ErrLayout, path, st.Size(), inboxBytes(senders, data))
	case sender < 0 || sender >= senders:
		return nil, fmt.Errorf("%w: %s: sender %d of %d", ErrLayout, path, sender, senders)
	}
	mem, err := unix.MmapShared(int(f.Fd()), 0, int(st.Size()))
	if err != nil {
		return nil, fmt.Errorf("shm: map inbox %s: %w", path, err)
	}
	off := inboxHdr + sender*ringBytes(data)
	return &Outbox{mem: mem, ring: NewProducer(mem[off : off+ringBytes(data)]), bell: bell(mem), sleep: sleeping(mem),
		owner: int(binary.LittleEndian.Uint32(hdr[16:]))}, nil
}

// Owner is the pid of the inbox's owner.
func (o *Outbox) Owner() int { return o.owner }

// Ring is the producer of this sender's ring.
func (o *Outbox) Ring() *Producer { return o.ring }

// Write publishes a frame made of parts and wakes the owner if it sleeps.
// It returns false when the ring is full.
func (o *Outbox) Write(parts ...[]byte) (bool, error) {
	ok, err := o.ring.Write(parts...)
	if ok {
		o.Notify()
	}
	return ok, err
}

// Notify wakes the owner if it sleeps: after Commit of a frame written
// with Reserve.
func (o *Outbox) Notify() {
	if o.sleep.Load() != 0 {
		o.bell.Add(1)
		unix.FutexWake(o.bell, 1)
	}
}

// Room tells the owner, a sender to this rank, that its ring here has
// room again. Unlike Notify it always rings the bell: the owner may have
// found the ring full and be about to sleep, having read the bell (Seq)
// before it tried, but not yet marked itself asleep; the ring it then
// finds tells it to stay awake. It wakes the owner only if it sleeps.
func (o *Outbox) Room() {
	o.bell.Add(1)
	if o.sleep.Load() != 0 {
		unix.FutexWake(o.bell, 1)
	}
}

// Close unmaps the outbox.
func (o *Outbox) Close() error {
	err := unix.Munmap(o.mem)
	o.mem, o.ring = nil, nil
	return err
}

// Pull copies len(dst) bytes at addr in process pid into dst with one
// copy (process_vm_readv): how a large message moves between ranks of a
// node. It needs the right to ptrace pid (same user, and the Yama
// ptrace_scope sysctl at 0 or the sender's PR_SET_PTRACER); the error says
// so when the kernel refuses.
func Pull(pid int, addr uint64, dst []byte) error {
	err := unix.ProcessVMRead(pid, dst, addr)
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("shm: %w: %w (allow it with sysctl kernel.yama.ptrace_scope=0 or 1; comm copies through the ring instead)", transport.ErrReadRefused, err)
	}
	return err
}
