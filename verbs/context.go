package verbs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
)

// ErrNotSupported is returned, wrapped, when a device lacks an optional
// capability. Match it with errors.Is.
var ErrNotSupported = errors.New("not supported")

// ErrClosed is returned for operations on a closed object.
var ErrClosed = errors.New("object closed")

// Context is an open device (struct ibv_context). It is safe for concurrent
// use. Close it after every object created from it has been closed.
type Context struct {
	name string
	prov Provider
	log  *slog.Logger

	mu       sync.Mutex
	closed   bool           // guarded by mu
	objects  map[uint64]any // guarded by mu: live objects by handle, for events
	next     uint64         // guarded by mu: last handle given out
	children int            // guarded by mu: live objects created from the context

	attrOnce sync.Once
	attr     DeviceAttr
	attrErr  error

	features sync.Map // Feature -> error (nil or ErrNotSupported-wrapped): cached probes
}

// NewContext wraps an opened provider. Drivers' Open results reach users
// through it; tests use it to run a provider directly.
func NewContext(name string, p Provider, cfg Config) *Context {
	return &Context{name: name, prov: p, log: cfg.logger(), objects: map[uint64]any{}}
}

// Name is the device's name.
func (c *Context) Name() string { return c.name }

// Provider returns the provider behind the context, for capability
// interfaces not wrapped by this package.
func (c *Context) Provider() Provider { return c.prov }

// Close closes the device. It fails with an error wrapping EBUSY while
// objects created from the context are alive.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	if c.children > 0 {
		return fmt.Errorf("close device %s: %d objects still open: %w", c.name, c.children, syscall.EBUSY)
	}
	c.closed = true
	return c.prov.Close()
}

// register records a new object and returns its handle.
func (c *Context) register() (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, ErrClosed
	}
	c.next++
	c.children++
	return c.next, nil
}

// publish makes an object visible to event dispatch.
func (c *Context) publish(h uint64, obj any) {
	c.mu.Lock()
	c.objects[h] = obj
	c.mu.Unlock()
}

// unregister forgets an object that was destroyed, or whose creation failed.
func (c *Context) unregister(h uint64) {
	c.mu.Lock()
	delete(c.objects, h)
	c.children--
	c.mu.Unlock()
}

func (c *Context) lookup(h uint64) any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.objects[h]
}

// QueryDevice reports the device's attributes. The result is cached.
func (c *Context) QueryDevice() (DeviceAttr, error) {
	c.attrOnce.Do(func() {
		c.attr, c.attrErr = c.prov.QueryDevice()
		if c.attrErr != nil {
			c.attrErr = fmt.Errorf("query device %s: %w", c.name, c.attrErr)
		}
	})
	return c.attr, c.attrErr
}

// QueryPort reports a port's attributes (ports are numbered from 1).
func (c *Context) QueryPort(port uint8) (PortAttr, error) {
	a, err := c.prov.QueryPort(port)
	if err != nil {
		return a, fmt.Errorf("query port %d of %s: %w", port, c.name, err)
	}
	return a, nil
}

// Feature is an optional device capability.
type Feature int

// Features.
const (
	// FeatureSRQResize: SRQ.Modify with SRQMaxWR.
	FeatureSRQResize Feature = iota + 1
)

func (f Feature) String() string {
	switch f {
	case FeatureSRQResize:
		return "SRQ resize"
	case FeatureXRC:
		return "XRC"
	}
	return fmt.Sprintf("Feature(%d)", int(f))
}

// UnsupportedFeatureError says which feature is missing and why; it
// matches ErrNotSupported.
type UnsupportedFeatureError struct {
	Feature Feature
	Device  string
	Reason  string
	Err     error // the device's answer (EOPNOTSUPP), when it gave one
}

func (e *UnsupportedFeatureError) Error() string {
	return fmt.Sprintf("%s on %s: %s: not supported", e.Feature, e.Device, e.Reason)
}

// Is makes the error match ErrNotSupported.
func (e *UnsupportedFeatureError) Is(target error) bool { return target == ErrNotSupported }

// Unwrap returns the device's answer, if any.
func (e *UnsupportedFeatureError) Unwrap() error { return e.Err }

// Supports probes an optional feature. Only nil (supported) and an error
// matching ErrNotSupported are conclusive, and only they are cached; other
// errors (the device could not be queried) are returned as they are.
func (c *Context) Supports(f Feature) error {
	if v, ok := c.features.Load(f); ok {
		err, _ := v.(error)
		return err
	}
	err := c.probe(f)
	if err == nil || errors.Is(err, ErrNotSupported) {
		c.features.Store(f, err)
	}
	return err
}

// probe decides a feature from the device's capability bits.
func (c *Context) probe(f Feature) error {
	var bit DeviceCap
	switch f {
	case FeatureSRQResize:
		bit = DeviceCapSRQResize
	case FeatureXRC:
		if _, ok := c.prov.(XRCProvider); !ok {
			return &UnsupportedFeatureError{Feature: f, Device: c.name, Reason: "its provider has no XRC"}
		}
		bit = DeviceCapXRC
	default:
		return &UnsupportedFeatureError{Feature: f, Device: c.name, Reason: "unknown feature"}
	}
	attr, err := c.QueryDevice()
	if err != nil {
		return err
	}
	if attr.DeviceCapFlags&bit == 0 {
		return &UnsupportedFeatureError{Feature: f, Device: c.name,
			Reason: "the device does not report " + deviceCapNames[bit]}
	}
	return nil
}

// EventType is the type of an async event (enum ibv_event_type).
type EventType uint32

// Async event types.
const (
	EventCQErr            EventType = 0
	EventQPFatal          EventType = 1
	EventQPReqErr         EventType = 2
	EventQPAccessErr      EventType = 3
	EventCommEst          EventType = 4
	EventSQDrained        EventType = 5
	EventPathMig          EventType = 6
	EventPathMigErr       EventType = 7
	EventDeviceFatal      EventType = 8
	EventPortActive       EventType = 9
	EventPortErr          EventType = 10
	EventLIDChange        EventType = 11
	EventPkeyChange       EventType = 12
	EventSMChange         EventType = 13
	EventSRQErr           EventType = 14
	EventSRQLimitReached  EventType = 15
	EventQPLastWQEReached EventType = 16
	EventClientReregister EventType = 17
	EventGIDChange        EventType = 18
)

var eventNames = [...]string{
	"CQ_ERR", "QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR", "COMM_EST", "SQ_DRAINED", "PATH_MIG",
	"PATH_MIG_ERR", "DEVICE_FATAL", "PORT_ACTIVE", "PORT_ERR", "LID_CHANGE", "PKEY_CHANGE",
	"SM_CHANGE", "SRQ_ERR", "SRQ_LIMIT_REACHED", "QP_LAST_WQE_REACHED", "CLIENT_REREGISTER", "GID_CHANGE",
}

// Error makes an event type an error, so that the error of an object an
// event reported failed (a QP's QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR) can
// wrap it for errors.Is. Events that report no failure are no errors:
// callers wrap only those that do.
func (t EventType) Error() string { return t.String() }

func (t EventType) String() string {
	if int(t) < len(eventNames) {
		return eventNames[t]
	}
	return fmt.Sprintf("EventType(%d)", uint32(t))
}

// AsyncEvent is an event about a QP, CQ, SRQ, port or the device.
type AsyncEvent struct {
	Type EventType
	QP   *QP  // for QP events
	CQ   *CQ  // for CQ events
	SRQ  *SRQ // for SRQ events
	Port uint8
}

// GetAsyncEvent waits for the next async event of the device, or until ctx
// is done. Events of objects that were closed since are skipped. Run one
// waiter at a time.
func (c *Context) GetAsyncEvent(ctx context.Context) (AsyncEvent, error) {
	var buf [16]byte // struct ib_uverbs_async_event_desc
	for {
		if _, err := readEvent(ctx, c.prov.AsyncEvents(), buf[:]); err != nil {
			return AsyncEvent{}, fmt.Errorf("get async event: %w", err)
		}
		elem := binary.NativeEndian.Uint64(buf[0:])
		ev := AsyncEvent{Type: EventType(binary.NativeEndian.Uint32(buf[8:]))}
		switch ev.Type {
		case EventPortActive, EventPortErr, EventLIDChange, EventPkeyChange, EventSMChange,
			EventClientReregister, EventGIDChange:
			ev.Port = uint8(elem)
			return ev, nil
		case EventDeviceFatal:
			return ev, nil
		}
		switch o := c.lookup(elem).(type) {
		case *QP:
			ev.QP = o
		case *CQ:
			ev.CQ = o
		case *SRQ:
			ev.SRQ = o
		default:
			continue // the object is gone
		}
		return ev, nil
	}
}

// readEvent reads one record from an event file, or returns ctx.Err() when
// ctx ends first. The file must be pollable (non-blocking).
func readEvent(ctx context.Context, f *os.File, buf []byte) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		f.SetReadDeadline(time.Unix(1, 0))
		close(fired)
	})
	n, err := f.Read(buf)
	if !stop() {
		// The deadline was set: clear it for the next read.
		<-fired
		f.SetReadDeadline(time.Time{})
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, ctx.Err()
		}
	}
	if err != nil {
		return 0, err
	}
	if n != len(buf) {
		return 0, fmt.Errorf("short event record: %d of %d bytes", n, len(buf))
	}
	return n, nil
}
