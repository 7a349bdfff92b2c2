package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

// labels lists the labels of devices' output in order, up to the port
// counters (which ibv_devinfo does not print): the text before the colon
// of every line that has one.
func labels(out string) []string {
	var l []string
	for _, line := range strings.Split(out, "\n") {
		name, _, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue // a blank line, a device_cap_flags name
		}
		if name == "counters" {
			break
		}
		l = append(l, name)
	}
	return l
}

// TestDevicesLayout: devices prints ibv_devinfo's lines in ibv_devinfo's
// order (rdma-core libibverbs/examples/devinfo.c, print_hca_cap): without
// -v the device's identity and each port's state, with -v the device's
// limits between phys_port_cnt and the ports, and each port's GIDs.
func TestDevicesLayout(t *testing.T) {
	t.Setenv(softhca.RuntimeDirEnv, t.TempDir())
	startHCA(t, "soft9")
	brief := []string{"hca_id", "transport", "fw_ver", "node_guid", "sys_image_guid", "vendor_id", "vendor_part_id",
		"hw_ver", "phys_port_cnt"}
	port := []string{"port", "state", "max_mtu", "active_mtu", "sm_lid", "port_lid", "port_lmc", "link_layer"}
	limits := []string{"max_mr_size", "page_size_cap", "max_qp", "max_qp_wr", "device_cap_flags", "max_sge",
		"max_sge_rd", "max_cq", "max_cqe", "max_mr", "max_pd", "max_qp_rd_atom", "max_res_rd_atom",
		"max_qp_init_rd_atom", "atomic_cap", "max_srq", "max_srq_wr", "max_srq_sge", "max_pkeys", "local_ca_ack_delay"}
	portMore := []string{"max_msg_sz", "port_cap_flags", "max_vl_num", "bad_pkey_cntr", "qkey_viol_cntr", "sm_sl",
		"pkey_tbl_len", "gid_tbl_len", "subnet_timeout", "init_type_reply", "active_width", "active_speed",
		"phys_state", "GID[  0]"}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"devices"}, slices.Concat(brief, port)},
		{[]string{"devices", "-v"}, slices.Concat(brief, limits, port, portMore)},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), tc.args, &out, os.Stderr); err != nil {
			t.Fatal(err)
		}
		if got := labels(out.String()); !slices.Equal(got, tc.want) {
			t.Errorf("xrcrun %s prints\n%q\nwant\n%q\n%s", strings.Join(tc.args, " "), got, tc.want, out.String())
		}
		// A soft HCA's GID is RoCE v2 (its IPv4 address, mapped), on an
		// Ethernet port: inet_ntop's form and the type.
		if gid := regexp.MustCompile(`\t\t\tGID\[  0\]:\t\t::ffff:127(\.[0-9]+){3}, RoCE v2\n`); len(tc.args) > 1 &&
			!gid.MatchString(out.String()) {
			t.Errorf("xrcrun %s prints no GID line matching %s:\n%s", strings.Join(tc.args, " "), gid, out.String())
		}
	}
}

// TestDevicesFlags: ibv_devinfo's -l (--list) and -i (--ib-port), and the
// long forms of -d and -v (devinfo.c, main and print_hca_cap).
func TestDevicesFlags(t *testing.T) {
	t.Setenv(softhca.RuntimeDirEnv, t.TempDir())
	startHCA(t, "soft10")
	devices := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"devices"}, args...), &out, &bytes.Buffer{})
		return out.String(), err
	}
	for _, args := range [][]string{{"-l"}, {"--list"}} {
		if out, err := devices(args...); err != nil || out != "1 HCA found:\n\tsoft10\n\n" {
			t.Errorf("devices %s: %q, %v", args[0], out, err)
		}
	}
	all, err := devices("-v")
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"-i", "1", "-v"}, {"--ib-port", "1", "--verbose", "--ib-dev", "soft10"}} {
		if out, err := devices(args...); err != nil || labels(out) == nil || !slices.Equal(labels(out), labels(all)) {
			t.Errorf("devices %q: %v\n%s\nwant\n%s", args, err, out, all)
		}
	}
	// A port the device does not have fails, printing nothing of it;
	// so does a port that is not positive.
	if out, err := devices("-i", "2"); err == nil || !strings.Contains(err.Error(), "Invalid port requested for device") || out != "" {
		t.Errorf("devices -i 2: %q, %v", out, err)
	}
	for _, bad := range []string{"0", "-1"} {
		if _, err := devices("-i", bad); err == nil {
			t.Errorf("devices -i %s: no error", bad)
		}
	}
}

// TestDevicesPortValues: devices -v prints a port's VL count, width, speed
// and physical state as ibv_devinfo -v does, the name and then the number
// (devinfo.c: vl_str, width_str, speed_str, port_phy_state_str).
func TestDevicesPortValues(t *testing.T) {
	t.Setenv(softhca.RuntimeDirEnv, t.TempDir())
	startHCA(t, "soft11")
	var out bytes.Buffer
	if err := run(context.Background(), []string{"devices", "-v"}, &out, os.Stderr); err != nil {
		t.Fatal(err)
	}
	// A soft HCA is a RoCE device, whose transport libibverbs reports as
	// InfiniBand, as for rxe.
	if want := "\ttransport:\t\t\tInfiniBand (0)\n"; !strings.Contains(out.String(), want) {
		t.Errorf("devices -v prints no %q:\n%s", want, out.String())
	}
	// The soft HCA's port: 1 VL, 1X, 25 Gb/s (EDR), link up.
	for _, want := range []string{"\t\t\tmax_vl_num:\t\t1 (1)\n", "\t\t\tactive_width:\t\t1X (1)\n",
		"\t\t\tactive_speed:\t\t25.0 Gbps (32)\n", "\t\t\tphys_state:\t\tLINK_UP (5)\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("devices -v prints no %q:\n%s", want, out.String())
		}
	}
}

// TestKernelPortCounters: a kernel device's port counters are those of
// sysfs's ports/N/counters (the PMA's) and ports/N/hw_counters (the
// driver's: local_ack_timeout_err, out_of_sequence, ...), as
// drivers/infiniband/core/sysfs.c makes them; hw_counters/lifespan is a
// setting, not a counter.
func TestKernelPortCounters(t *testing.T) {
	sysfsClass = t.TempDir()
	t.Cleanup(func() { sysfsClass = "/sys/class/infiniband" })
	port := filepath.Join(sysfsClass, "mlx4_0", "ports", "1")
	for file, v := range map[string]string{"counters/port_xmit_data": "100\n", "counters/port_rcv_errors": "2\n",
		"hw_counters/out_of_sequence": "7\n", "hw_counters/local_ack_timeout_err": "3\n", "hw_counters/lifespan": "10\n"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(port, file)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(port, file), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := portCounters(context.Background(), verbs.DeviceInfo{Name: "mlx4_0", Driver: "mlx4"}, 1)
	want := []softhca.Counter{{Name: "local_ack_timeout_err", Value: 3}, {Name: "out_of_sequence", Value: 7},
		{Name: "port_rcv_errors", Value: 2}, {Name: "port_xmit_data", Value: 100}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("counters %v, %v; want %v", got, err, want)
	}
}
