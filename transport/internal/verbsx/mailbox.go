package verbsx

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/xrcrun/xrc/bootstrap"
)

// Mailbox is how the ranks of a job send each other connection messages
// for lazy connection: rank R's mailbox is the bootstrap server's
// write-once keys "PREFIX/mbox/R/0", "PREFIX/mbox/R/1", …, each holding
// one message (and its putter's tag, mailTag). Its methods are safe for
// concurrent use.
type Mailbox struct {
	boot   *bootstrap.Client
	prefix string

	mu   sync.Mutex
	next map[int]int // per rank, a slot below which every slot is taken
	sent uint32      // messages put, numbering them
}

// A message's value in its slot ends with the putter's rank and number,
// so that two equal messages are two values: the bootstrap server takes
// a Put of the value a key already holds as done, and the second message
// would have been lost.
const mailTag = 8

// NewMailbox returns the mailboxes of the job boot belongs to, under the
// key prefix (the transport's name).
func NewMailbox(boot *bootstrap.Client, prefix string) *Mailbox {
	return &Mailbox{boot: boot, prefix: prefix, next: map[int]int{}}
}

func (m *Mailbox) key(rank, slot int) string {
	return fmt.Sprintf("%s/mbox/%d/%d", m.prefix, rank, slot)
}

// Put puts val in rank's mailbox, in its first free slot. Slots are never
// freed, so the search starts past those this process already found
// taken.
func (m *Mailbox) Put(ctx context.Context, rank int, val []byte) error {
	m.mu.Lock()
	slot := m.next[rank]
	m.sent++
	val = binary.LittleEndian.AppendUint32(slices.Clip(val), uint32(m.boot.Rank())) // a copy: the caller's stays
	val = binary.LittleEndian.AppendUint32(val, m.sent)
	m.mu.Unlock()
	for ; ; slot++ {
		err := m.boot.Put(ctx, m.key(rank, slot), val)
		if errors.Is(err, bootstrap.ErrKeyExists) {
			continue
		}
		if err == nil {
			m.mu.Lock()
			m.next[rank] = max(m.next[rank], slot+1)
			m.mu.Unlock()
		}
		return err
	}
}

// Read gives fn the messages of rank's mailbox in order, waiting for each,
// until a Get fails (ctx ended, the job ended); it returns that error.
func (m *Mailbox) Read(ctx context.Context, rank int, fn func(slot int, val []byte)) error {
	for slot := 0; ; slot++ {
		v, err := m.boot.Get(ctx, m.key(rank, slot))
		if err != nil {
			return err
		}
		if len(v) < mailTag {
			v = nil // malformed: fn refuses it
		} else {
			v = v[:len(v)-mailTag]
		}
		fn(slot, v)
	}
}
