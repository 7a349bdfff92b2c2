package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
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
//	+64   bell: a count of the rings of the bell, which senders bump; a
//	      futex word an owner with nothing else to wait for sleeps on
//	+128  sleeping: non-zero while the owner is, or is about to be, asleep:
//	      1 in a futex wait on the bell, 2 in the network poller
//	+4096 ring 0, ring 1, ... (ringBytes(data) each)
//
// Next to it, at its path + ".bell", is a FIFO: the bell an owner with
// other wake-ups (its devices' completion channels) waits on, together
// with their descriptors, in an epoll instance that Go's network poller
// watches: the owner's goroutine parks and holds no P while it sleeps, and
// the runtime's one epoll_wait wakes for every source (in a futex wait, a
// system call, it kept the P until the runtime's monitor took it back, and
// the goroutine reading the completion channel had none to run on).
// Senders bump the count, and wake a sleeping owner the way its mark says:
// a futex wake, or a byte into the FIFO; the owner opens the FIFO for
// reading and writing (it never sees its end, and Kick writes to it) and
// empties it after each sleep. The owner alone creates, sizes and removes
// the files; senders only map the inbox, after checking its header and
// size, and open the FIFO for writing.
const (
	inboxHdr  = 4096
	bellOff   = 64
	sleepOff  = 128
	inboxVers = "XRCSHMv1"
)

// bellSuffix names an inbox's FIFO: its path and this.
const bellSuffix = ".bell"

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
	fifo  int // the bell's FIFO, read and write
	// The owner sleeps in Go's network poller, on an epoll instance that
	// holds the FIFO and WaitFor's descriptors (watched).
	ep      *os.File
	epfd    int // ep's number: its Fd would make it blocking
	epRaw   syscall.RawConn
	watched []int
	evs     [8]unix.EpollEvent
	// kmu orders Kick, which other goroutines call, before Close's unmap
	// and the FIFO's close: a Kick after Close does nothing (it wrote to
	// unmapped memory).
	kmu    sync.RWMutex
	closed bool // guarded by kmu
}

// CreateInbox creates the inbox file at path (which must not exist) with a
// ring of data bytes for each of senders senders, and maps it, and its
// bell's FIFO at path + ".bell" (which must not exist either). The file
// appears at path complete, header and all, and after the FIFO.
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
	// The FIFO first: a sender that finds the inbox finds its bell.
	if err := unix.Mkfifo(path+bellSuffix, 0o600); err != nil {
		return nil, fmt.Errorf("shm: create inbox bell: %w", err)
	}
	fifo, created := -1, false
	defer func() { // on failure, before the inbox is in place
		if !created {
			if fifo >= 0 {
				unix.Close(fifo)
			}
			os.Remove(path + bellSuffix)
		}
	}()
	if fifo, err = unix.OpenFIFO(path+bellSuffix, false); err != nil {
		return nil, fmt.Errorf("shm: open inbox bell: %w", err)
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
	created = true // from here Close removes both
	in := &Inbox{path: path, mem: mem, bell: bell(mem), sleep: sleeping(mem), fifo: fifo}
	if err := in.makePoller(); err != nil {
		in.Close()
		return nil, err
	}
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
func (in *Inbox) Wait(d time.Duration) error { return in.WaitFor(in.Seq(), d, nil) }

// Seq is the bell's count of rings: a caller that reads it before it looks
// for work and passes it to WaitFrom misses no Kick that came in between.
func (in *Inbox) Seq() uint32 { return in.bell.Load() }

// WaitFrom is Wait that also returns at once if the bell has rung since
// it read seq (Seq).
func (in *Inbox) WaitFrom(seq uint32, d time.Duration) error { return in.WaitFor(seq, d, nil) }

// WaitFor is WaitFrom that also returns when one of the descriptors fds
// is readable (a device's completion channel), which stay open while it
// waits. The goroutine parks in Go's network poller, on an epoll instance
// holding the FIFO and fds (kept from one call to the next), so that it
// holds no P while it sleeps. What made an fd readable is the caller's to
// take: left there, it ends the next wait at once.
//
// The owner marks itself asleep before it looks at the rings and the
// bell's count, and a sender publishes its frame (or bumps the count)
// before it reads the mark: either the owner sees the frame, or the sender
// sees the mark and writes into the FIFO, which keeps the byte until the
// owner reads it, so that a ring just before the wait ends it at once.
//
// With no fds it sleeps in a futex wait on the bell's count instead, which
// wakes sooner (an 8-byte ping-pong between two ranks of a node that
// sleep at once: 10.8-15.6 µs one way, against 17.0-25.6 in the network
// poller) but holds the goroutine's P while it sleeps; the sleeping mark
// says which, and a sender wakes the owner the way it sleeps.
func (in *Inbox) WaitFor(seq uint32, d time.Duration, fds []int) error {
	how := uint32(sleepFutex)
	if len(fds) > 0 {
		how = sleepPoller
	}
	in.sleep.Store(how)
	var err error
	if !in.Pending() && in.bell.Load() == seq {
		if how == sleepFutex {
			err = unix.FutexWait(in.bell, seq, d)
		} else if err = in.watch(fds); err == nil {
			err = in.poll(d)
		}
	}
	in.sleep.Store(0)
	return err
}

// How the owner sleeps, in its sleeping mark: in a futex wait on the
// bell's count, or in the network poller on the FIFO.
const (
	sleepFutex  = 1
	sleepPoller = 2
)

// wake wakes an owner that sleeps as how says.
func wake(how uint32, bell *atomic.Uint32, fifo int) {
	switch how {
	case sleepFutex:
		unix.FutexWake(bell, 1)
	case sleepPoller:
		ring(fifo)
	}
}

// makePoller makes the epoll instance the owner sleeps on, with the FIFO
// in it, in Go's network poller.
func (in *Inbox) makePoller() error {
	ep, err := unix.EpollCreate()
	if err != nil {
		return fmt.Errorf("shm: inbox bell: %w", err)
	}
	if err := unix.EpollAdd(ep, in.fifo); err != nil {
		unix.Close(ep)
		return fmt.Errorf("shm: inbox bell: %w", err)
	}
	in.ep, in.epfd = os.NewFile(uintptr(ep), in.path+bellSuffix+"-epoll"), ep
	if in.epRaw, err = in.ep.SyscallConn(); err != nil {
		return fmt.Errorf("shm: inbox bell: %w", err)
	}
	return nil
}

// watch makes the poller hold the FIFO and fds. A descriptor watched
// since an earlier call is checked by registering it again (EpollMod): the
// poller dropped its file when it closed, and the number may name another
// file now. Epoll keys a registration by its file: one whose number was
// closed while the file lives on (a duplicate elsewhere) can be removed no
// more, and would end every wait while that file is readable; so when a
// descriptor no longer names the file it was watched for, the poller is
// made again.
func (in *Inbox) watch(fds []int) error {
	fresh := in.ep != nil // nil: making it again failed
	for _, fd := range in.watched {
		if !fresh {
			break
		}
		if !slices.Contains(fds, fd) {
			fresh = unix.EpollDel(in.epfd, fd) == nil
		} else if err := unix.EpollMod(in.epfd, fd); err != nil {
			if !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("shm: inbox bell: %w", err)
			}
			fresh = false
		}
	}
	old := in.watched
	if !fresh {
		if in.ep != nil {
			in.ep.Close()
		}
		in.ep, in.watched, old = nil, nil, nil
		if err := in.makePoller(); err != nil {
			return err
		}
	}
	for _, fd := range fds {
		if !slices.Contains(old, fd) {
			if err := unix.EpollAdd(in.epfd, fd); err != nil {
				return fmt.Errorf("shm: inbox bell: %w", err)
			}
		}
	}
	in.watched = append(in.watched[:0], fds...)
	return nil
}

// poll waits, parked in Go's network poller, until a descriptor of the
// poller is readable or d passes, and empties the FIFO if it was.
func (in *Inbox) poll(d time.Duration) error {
	deadline := time.Time{}
	if d > 0 {
		deadline = time.Now().Add(d)
	}
	if err := in.ep.SetReadDeadline(deadline); err != nil {
		return fmt.Errorf("shm: inbox bell: %w", err)
	}
	var rang bool
	var perr error
	err := in.epRaw.Read(func(ep uintptr) bool {
		n, err := unix.EpollPoll(int(ep), in.evs[:])
		if err != nil {
			perr = err
			return true
		}
		for _, ev := range in.evs[:n] {
			rang = rang || ev.Fd == int32(in.fifo)
		}
		return n > 0
	})
	if rang {
		in.drain()
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = nil
	}
	if err = errors.Join(err, perr); err != nil {
		return fmt.Errorf("shm: inbox bell: %w", err)
	}
	return nil
}

// drain empties the bell's FIFO, so that the next wait sleeps.
func (in *Inbox) drain() {
	var buf [64]byte
	for {
		n, err := unix.Read(in.fifo, buf[:])
		if err != nil || n < len(buf) {
			return
		}
	}
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
	wake(in.sleep.Load(), in.bell, in.fifo)
	return nil
}

// ring writes a byte into a bell's FIFO. A full FIFO (its owner has not
// emptied it yet) rings already, and one whose owner is gone has nobody
// to wake, so the write's errors do not matter.
func ring(fd int) {
	unix.Write(fd, oneByte[:])
}

var oneByte = [1]byte{1}

// Close unmaps the inbox and removes its file. Senders that still map it
// keep their mapping; nobody reads it any more.
func (in *Inbox) Close() error {
	in.kmu.Lock()
	defer in.kmu.Unlock()
	if in.closed {
		return nil
	}
	in.closed = true
	err := errors.Join(os.Remove(in.path), os.Remove(in.path+bellSuffix), unix.Close(in.fifo))
	if in.ep != nil {
		err = errors.Join(err, in.ep.Close())
	}
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
	fifo  int // the owner's bell, opened for writing
	owner int // the inbox owner's pid, as its header says
}

// OpenOutbox maps the inbox file at path as sender number sender, after
// checking that its header and size agree with each other, and opens its
// bell's FIFO.
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
	fifo, err := unix.OpenFIFO(path+bellSuffix, true)
	if err != nil {
		return nil, fmt.Errorf("shm: open the bell of inbox %s: %w", path, err)
	}
	mem, err := unix.MmapShared(int(f.Fd()), 0, int(st.Size()))
	if err != nil {
		unix.Close(fifo)
		return nil, fmt.Errorf("shm: map inbox %s: %w", path, err)
	}
	off := inboxHdr + sender*ringBytes(data)
	return &Outbox{mem: mem, ring: NewProducer(mem[off : off+ringBytes(data)]), bell: bell(mem), sleep: sleeping(mem),
		fifo: fifo, owner: int(binary.LittleEndian.Uint32(hdr[16:]))}, nil
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
	if how := o.sleep.Load(); how != 0 {
		o.bell.Add(1)
		wake(how, o.bell, o.fifo)
	}
}

// Room tells the owner, a sender to this rank, that its ring here has
// room again. Unlike Notify it always rings the bell: the owner may have
// found the ring full and be about to sleep, having read the bell (Seq)
// before it tried, but not yet marked itself asleep; the ring it then
// finds tells it to stay awake. It wakes the owner only if it sleeps.
func (o *Outbox) Room() {
	o.bell.Add(1)
	wake(o.sleep.Load(), o.bell, o.fifo)
}

// Close unmaps the outbox and closes its bell.
func (o *Outbox) Close() error {
	err := errors.Join(unix.Munmap(o.mem), unix.Close(o.fifo))
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
