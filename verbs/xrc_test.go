package verbs

import (
	"errors"
	"os"
	"syscall"
	"testing"
)

// xrcCapsProvider has the XRC interface; its OpenXRCD fails with err.
type xrcCapsProvider struct {
	capsProvider
	err   error
	opens int
}

func (p *xrcCapsProvider) OpenXRCD(fd, oflags int) (ProviderXRCD, error) {
	p.opens++
	return nil, p.err
}
func (p *xrcCapsProvider) CreateXRCSRQ(ProviderPD, ProviderXRCD, ProviderCQ, SRQInit) (ProviderSRQ, error) {
	return nil, syscall.ENOSYS
}
func (p *xrcCapsProvider) CreateXRCTgtQP(ProviderXRCD, uint64) (ProviderQP, error) {
	return nil, syscall.ENOSYS
}
func (p *xrcCapsProvider) OpenXRCQP(ProviderXRCD, uint32, uint64) (ProviderQP, error) {
	return nil, syscall.ENOSYS
}

// TestXRCNotSupported checks the verdicts of the XRC probe: a provider
// without the XRC interface (which still compiles and works), a device
// without the capability bit, and a kernel that answers EOPNOTSUPP.
func TestXRCNotSupported(t *testing.T) {
	// A provider built without XRC: every XRC entry point says so.
	plain := NewContext("plain0", &capsProvider{caps: DeviceCapXRC}, Config{})
	if err := plain.Supports(FeatureXRC); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("provider without XRC: %v", err)
	}
	if _, err := plain.OpenXRCD(nil, os.O_CREATE); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("OpenXRCD on a provider without XRC: %v", err)
	}
	pd := &PD{ctx: plain}
	if _, err := pd.CreateQP(&QPInitAttr{Type: QPTXRCIni, SendCQ: &CQ{ctx: plain}}); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("XRC_INI QP on a provider without XRC: %v", err)
	}

	// The interface, but a device without IB_DEVICE_XRC: no command is sent.
	noBit := &xrcCapsProvider{}
	c := NewContext("nobit0", noBit, Config{})
	_, err := c.OpenXRCD(nil, 0)
	var ufe *UnsupportedFeatureError
	if !errors.Is(err, ErrNotSupported) || !errors.As(err, &ufe) || ufe.Feature != FeatureXRC || noBit.opens != 0 {
		t.Fatalf("device without the XRC bit: %v (%d opens)", err, noBit.opens)
	}

	// The bit, but the kernel refuses: EOPNOTSUPP becomes the verdict, and
	// it is cached.
	refused := &xrcCapsProvider{capsProvider: capsProvider{caps: DeviceCapXRC}, err: syscall.EOPNOTSUPP}
	c = NewContext("refused0", refused, Config{})
	if err := c.Supports(FeatureXRC); err != nil {
		t.Fatalf("probe before the kernel answered: %v", err)
	}
	if _, err := c.OpenXRCD(nil, 0); !errors.Is(err, ErrNotSupported) || !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("kernel without XRC: %v", err)
	}
	if err := c.Supports(FeatureXRC); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("the kernel's EOPNOTSUPP was not cached: %v", err)
	}

	// Other errors stay what they are.
	busy := &xrcCapsProvider{capsProvider: capsProvider{caps: DeviceCapXRC}, err: syscall.EAGAIN}
	c = NewContext("busy0", busy, Config{})
	if _, err := c.OpenXRCD(nil, 0); !errors.Is(err, syscall.EAGAIN) || errors.Is(err, ErrNotSupported) {
		t.Fatalf("EAGAIN: %v", err)
	}
	if _, err := c.OpenXRCD(nil, os.O_APPEND); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("bad flags: %v", err)
	}
}
