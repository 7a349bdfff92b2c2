package verbs

import (
	"slices"
	"testing"
)

// TestDeviceCapNames: Names gives a mask's flags as ibv_devinfo -v prints
// them (rdma-core libibverbs/examples/devinfo.c, print_device_cap_flags):
// every flag of enum ibv_device_cap_flags by name, in bit order, then the
// bits it has no name for in one hex mask.
func TestDeviceCapNames(t *testing.T) {
	// An mlx4's flags, with the unnamed bits 15 and 30.
	c := DeviceCap(1<<0 | 1<<3 | 1<<4 | 1<<9 | 1<<15 | 1<<18 | 1<<23 | 1<<24 | 1<<25 | 1<<26 | 1<<29 | 1<<30)
	want := []string{"RESIZE_MAX_WR", "RAW_MULTI", "AUTO_PATH_MIG", "INIT_TYPE", "UD_IP_CSUM", "MEM_WINDOW_TYPE_2A",
		"MEM_WINDOW_TYPE_2B", "RC_IP_CSUM", "RAW_IP_CSUM", "MANAGED_FLOW_STEERING", "Unknown flags: 0x40008000"}
	if got := c.Names(); !slices.Equal(got, want) {
		t.Errorf("Names of %#x:\n%q\nwant\n%q", uint64(c), got, want)
	}
}
