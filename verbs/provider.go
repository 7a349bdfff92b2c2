package verbs

import (
	"context"
	"os"
)

// This file holds the contract between the verbs API and the providers (the
// userspace drivers, such as mlx4) that implement it for a kind of device.
//
// The verbs layer owns object lifetimes (parents outlive their children,
// handles for events), argument checks that need no device, and the QP state
// machine's explanations. A provider owns everything the device defines:
// command encoding, queue formats, doorbells, and the data path. Providers
// never call back into the verbs layer.
//
// Unless a method says otherwise, control-path methods may block on the
// device and are safe to call from any goroutine; the verbs layer does not
// call two control-path methods on the same object at once. Data-path
// methods (PostSend, PostRecv, Poll, Arm) must not block and must not
// allocate; they may be called concurrently with each other on different
// objects, and the provider serializes calls on one object itself.

// Driver opens devices of one kind. Drivers register themselves with
// RegisterDriver, normally in an init function.
type Driver interface {
	// Name identifies the driver ("mlx4", "soft").
	Name() string
	// Devices lists the devices the driver can open now. What it waits
	// for (a device service's answer) ends when ctx does.
	Devices(ctx context.Context) ([]DeviceInfo, error)
	// Open opens the named device. A name the driver has no device of is
	// an error wrapping ErrNoDevice (verbs.Open then asks the next
	// driver); any other error is the device's.
	Open(ctx context.Context, name string, cfg Config) (Provider, error)
}

// Provider is an open device: the core verbs every device has. Optional
// capabilities are separate interfaces that a Provider may also implement
// (see XRCProvider); callers reach them through Context's feature probes.
type Provider interface {
	QueryDevice() (DeviceAttr, error)
	// QueryPort reports port attributes; ports are numbered from 1.
	QueryPort(port uint8) (PortAttr, error)
	AllocPD() (ProviderPD, error)
	CreateCompChannel() (ProviderChannel, error)
	// CreateCQ creates a CQ of at least attr.CQE entries.
	CreateCQ(attr CQInit) (ProviderCQ, error)
	// AsyncEvents is the device's async event file. Reads return whole
	// struct ib_uverbs_async_event_desc records; the element of a QP, CQ or
	// SRQ event is the Handle the object was created with. The provider owns
	// the file and closes it in Close.
	AsyncEvents() *os.File
	// Close releases the device. The verbs layer calls it only after every
	// object created through the provider has been destroyed.
	Close() error
}

// CQInit describes a CQ to create.
type CQInit struct {
	CQE        int
	Channel    ProviderChannel // may be nil
	CompVector int
	// Handle is reported in completion events and async events of the CQ.
	Handle uint64
}

// SRQInit describes an SRQ to create.
type SRQInit struct {
	Attr   SRQAttr
	Handle uint64
}

// QPInit describes a QP to create: the verbs attributes with the CQs and SRQ
// resolved to provider objects. An XRC send QP (QPTXRCIni) has a SendCQ and
// neither RecvCQ nor SRQ.
type QPInit struct {
	Type   QPType
	SendCQ ProviderCQ
	RecvCQ ProviderCQ
	SRQ    ProviderSRQ
	Cap    QPCap
	SigAll bool
	Handle uint64
}

// ProviderPD is a protection domain.
type ProviderPD interface {
	// RegMR registers length bytes at addr, which the caller keeps mapped
	// and alive until Dereg.
	RegMR(addr uintptr, length uint64, access Access) (ProviderMR, error)
	CreateSRQ(attr SRQInit) (ProviderSRQ, error)
	CreateQP(attr QPInit) (ProviderQP, error)
	// Dealloc fails with EBUSY while objects use the PD.
	Dealloc() error
}

// ProviderMR is a registered memory region.
type ProviderMR interface {
	LKey() uint32
	RKey() uint32
	Dereg() error
}

// ProviderChannel is a completion event channel.
type ProviderChannel interface {
	// File is the channel's event file. Reads return whole struct
	// ib_uverbs_comp_event_desc records naming the CQ Handle. The provider
	// owns the file.
	File() *os.File
	Close() error
}

// ProviderCQ is a completion queue.
type ProviderCQ interface {
	// Poll fills wc with up to len(wc) completions and returns how many.
	// It does not allocate.
	Poll(wc []WorkCompletion) (int, error)
	// Arm requests a completion event for the next completion (or the next
	// solicited one). The event is delivered once.
	Arm(solicitedOnly bool) error
	// EventDelivered tells the provider that an event of this CQ was read
	// from the channel (ibv_cq_event bookkeeping).
	EventDelivered()
	// CQE is the number of entries the CQ can hold.
	CQE() int
	// Destroy fails with EBUSY while QPs or SRQs use the CQ.
	Destroy() error
}

// ProviderSRQ is a shared receive queue.
type ProviderSRQ interface {
	PostRecv(wr *RecvWR) error
	Modify(attr SRQAttr, mask SRQAttrMask) error
	Query() (SRQAttr, error)
	// Num is the SRQ number (the one XRC senders name).
	Num() uint32
	// Destroy fails with EBUSY while QPs use the SRQ.
	Destroy() error
}

// ProviderQP is a queue pair.
type ProviderQP interface {
	PostSend(wr *SendWR) error
	PostRecv(wr *RecvWR) error
	// Modify applies attr under mask; the verbs layer has already checked
	// the transition against the state table.
	Modify(attr *QPAttr, mask QPAttrMask) error
	Query(mask QPAttrMask) (QPAttr, QPCap, error)
	Num() uint32
	// Cap is the actual queue sizes, which may exceed those requested.
	Cap() QPCap
	Destroy() error
}
