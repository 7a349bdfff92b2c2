//go:build linux

package softhca

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSlowDeviceListed: a device service that is alive but slow to answer
// (a loaded machine) is listed, as ibv_get_device_list lists every device
// there is; only a socket nobody listens on any more (ECONNREFUSED: its
// device died) is left out. The listing gave each device one second and
// silently left out those that took longer. One that does not answer
// before the caller's context ends is reported in the error.
func TestSlowDeviceListed(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(RuntimeDirEnv, dir)
	// A socket left by a device that died.
	stale, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(dir, "stale0.sock"), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	// A device that answers its info request after two seconds.
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(dir, "slow0.sock"), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	answered := make(chan struct{})
	var once sync.Once
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, maxMessage)
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				if t, _, err := splitRequest(buf[:n]); err != nil || t != msgInfo {
					return
				}
				time.Sleep(2 * time.Second) // slow, not stuck
				info := deviceInfo{guid: 0x5107, mtu: 1024, name: "slow0"}
				c.Write(info.append(appendReply(nil, msgInfo, nil)))
				c.Read(buf) // until the client, its answer read, hangs up
				once.Do(func() { close(answered) })
			}()
		}
	}()
	// A device that never answers (stopped): the listing, which asks the
	// devices together, waits for it until the caller cancels, once it
	// has asked and slow0's answer has been taken.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stuck, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(dir, "stuck0.sock"), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	go func() {
		c, err := stuck.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		c.Read(make([]byte, maxMessage))
		<-answered
		cancel()
		c.Read(make([]byte, maxMessage)) // until the client hangs up
	}()
	devs, err := softDriver{}.Devices(ctx)
	if err == nil || !strings.Contains(err.Error(), "stuck0") {
		t.Errorf("list: %v; want stuck0's failure to answer", err)
	}
	names := make([]string, 0, len(devs))
	for _, d := range devs {
		names = append(names, d.Name)
	}
	if !slices.Contains(names, "slow0") {
		t.Errorf("devices %v lack slow0, which answers its info request after 2 s", names)
	}
	if slices.Contains(names, "stale0") {
		t.Errorf("devices %v list stale0, whose socket nobody listens on", names)
	}
}
