package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	_ "github.com/xrcrun/xrc/mlx4" // the driver of ConnectX-3 HCAs
	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
)

// runDevices prints every RDMA device (or the one -d names) as ibv_devinfo
// does: the device, then each port; -v adds the remaining attributes and the
// port counters.
func runDevices(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("xrcrun devices", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var verbose, list bool
	var only string
	var port int
	fs.BoolVar(&verbose, "v", false, "print all attributes and the port counters")
	fs.BoolVar(&verbose, "verbose", false, "same as -v")
	fs.StringVar(&only, "d", "", "print only the device called `name`")
	fs.StringVar(&only, "ib-dev", "", "same as -d")
	fs.IntVar(&port, "i", 0, "print only `port` of the device (default all ports)")
	fs.IntVar(&port, "ib-port", 0, "same as -i")
	fs.BoolVar(&list, "l", false, "print only the devices' names")
	fs.BoolVar(&list, "list", false, "same as -l")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: xrcrun devices [-v] [-l] [-d NAME] [-i PORT]")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	portSet := false
	fs.Visit(func(f *flag.Flag) { portSet = portSet || f.Name == "i" || f.Name == "ib-port" })
	if portSet && port <= 0 {
		// ibv_devinfo: usage, and failure.
		fs.Usage()
		return fmt.Errorf("xrcrun devices: -i %d: ports are numbered from 1", port)
	}
	devs, err := verbs.Devices(ctx)
	if list {
		// ibv_devinfo -l: the names, also when there are none.
		if err != nil && len(devs) == 0 {
			return err
		}
		fmt.Fprintf(stdout, "%d HCA%s found:\n", len(devs), map[bool]string{true: "s"}[len(devs) != 1])
		for _, info := range devs {
			fmt.Fprintf(stdout, "\t%s\n", info.Name)
		}
		fmt.Fprintln(stdout)
		return err // a device that did not answer, told rather than left out silently
	}
	if len(devs) == 0 && (only == "" || err != nil) {
		// As ibv_devinfo: no device is a failure, told on stderr (with
		// -d, that the device was not found, below).
		return errors.Join(errNoDevices, err)
	}
	errs := []error{err} // a device that did not answer
	found := false
	for _, info := range devs {
		if only != "" && info.Name != only {
			continue
		}
		found = true
		if err := printDevice(ctx, stdout, info, port, verbose); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", info.Name, err))
		}
	}
	if !found {
		return errors.Join(fmt.Errorf("IB device '%s' wasn't found", only), err)
	}
	return errors.Join(errs...)
}

// errNoDevices is runDevices' failure when it finds no device at all.
var errNoDevices = errors.New("No IB devices found") // ibv_devinfo's words

// printDevice prints one device and its ports, or only port onePort if
// it is not 0.
func printDevice(ctx context.Context, w io.Writer, info verbs.DeviceInfo, onePort int, verbose bool) error {
	c, err := verbs.Open(ctx, info.Name, verbs.Config{})
	if err != nil {
		return err
	}
	defer c.Close()
	a, err := c.QueryDevice()
	if err != nil {
		return err
	}
	if onePort > int(a.PhysPortCnt) {
		return errors.New("Invalid port requested for device") // ibv_devinfo's words
	}
	p := func(name string, format string, v ...any) {
		fmt.Fprintf(w, "\t%s:%s"+format+"\n", append([]any{name, tabs(name, 1)}, v...)...)
	}
	fmt.Fprintf(w, "hca_id:\t%s\n", info.Name)
	// Every device here is InfiniBand or RoCE (a soft HCA is RoCE v2, as
	// rxe is), IBV_TRANSPORT_IB to libibverbs.
	p("transport", "%s", "InfiniBand (0)")
	if a.FwVer != "" {
		p("fw_ver", "%s", a.FwVer)
	}
	p("node_guid", "%s", guid(a.NodeGUID))
	p("sys_image_guid", "%s", guid(a.SysImageGUID))
	p("vendor_id", "0x%04x", a.VendorID)
	p("vendor_part_id", "%d", a.VendorPartID)
	p("hw_ver", "0x%X", a.HWVer)
	if id := boardID(info); id != "" {
		p("board_id", "%s", id)
	}
	p("phys_port_cnt", "%d", a.PhysPortCnt)
	if verbose {
		// ibv_devinfo -v's order; the limits verbs does not report
		// (max_ee, max_mw, max_ah, ...) are left out, not printed as 0.
		p("max_mr_size", "0x%x", a.MaxMRSize)
		p("page_size_cap", "0x%x", a.PageSizeCap)
		p("max_qp", "%d", a.MaxQP)
		p("max_qp_wr", "%d", a.MaxQPWR)
		p("device_cap_flags", "0x%08x", uint64(a.DeviceCapFlags))
		for _, n := range a.DeviceCapFlags.Names() {
			fmt.Fprintf(w, "\t\t\t\t\t%s\n", n)
		}
		p("max_sge", "%d", a.MaxSGE)
		p("max_sge_rd", "%d", a.MaxSGERd)
		p("max_cq", "%d", a.MaxCQ)
		p("max_cqe", "%d", a.MaxCQE)
		p("max_mr", "%d", a.MaxMR)
		p("max_pd", "%d", a.MaxPD)
		p("max_qp_rd_atom", "%d", a.MaxQPRdAtom)
		p("max_res_rd_atom", "%d", a.MaxResRdAtom)
		p("max_qp_init_rd_atom", "%d", a.MaxQPInitRdAtom)
		p("atomic_cap", "%s (%d)", atomicName(a.AtomicCap), a.AtomicCap)
		p("max_srq", "%d", a.MaxSRQ)
		if a.MaxSRQ != 0 {
			p("max_srq_wr", "%d", a.MaxSRQWR)
			p("max_srq_sge", "%d", a.MaxSRQSGE)
		}
		p("max_pkeys", "%d", a.MaxPkeys)
		p("local_ca_ack_delay", "%d", a.LocalCAAckDelay)
	}
	for n := 1; n <= int(a.PhysPortCnt); n++ { // an int: a uint8 would wrap at 255 ports
		port := uint8(n)
		if onePort != 0 && n != onePort {
			continue
		}
		pa, err := c.QueryPort(port)
		if err != nil {
			return err
		}
		q := func(name string, format string, v ...any) {
			fmt.Fprintf(w, "\t\t\t%s:%s"+format+"\n", append([]any{name, tabs(name, 3)}, v...)...)
		}
		fmt.Fprintf(w, "\t\tport:\t%d\n", port)
		q("state", "%s (%d)", pa.State, pa.State)
		q("max_mtu", "%s (%d)", pa.MaxMTU, pa.MaxMTU)
		q("active_mtu", "%s (%d)", pa.ActiveMTU, pa.ActiveMTU)
		q("sm_lid", "%d", pa.SMLID)
		q("port_lid", "%d", pa.LID)
		q("port_lmc", "0x%02x", pa.LMC)
		q("link_layer", "%s", pa.LinkLayer)
		if verbose {
			q("max_msg_sz", "0x%x", pa.MaxMsgSz)
			q("port_cap_flags", "0x%08x", pa.PortCapFlags)
			q("max_vl_num", "%s (%d)", vlNames.of(pa.MaxVLNum), pa.MaxVLNum)
			q("bad_pkey_cntr", "0x%x", pa.BadPkeyCntr)
			q("qkey_viol_cntr", "0x%x", pa.QkeyViolCntr)
			q("sm_sl", "%d", pa.SMSL)
			q("pkey_tbl_len", "%d", pa.PkeyTblLen)
			q("gid_tbl_len", "%d", pa.GIDTblLen)
			q("subnet_timeout", "%d", pa.SubnetTimeout)
			q("init_type_reply", "%d", 0)
			q("active_width", "%sX (%d)", widthNames.of(pa.ActiveWidth), pa.ActiveWidth)
			q("active_speed", "%s (%d)", speedNames.of(pa.ActiveSpeed), pa.ActiveSpeed)
			q("phys_state", "%s (%d)", physStateNames.of(pa.PhysState), pa.PhysState)
			printGID(w, info, port, pa)
			if counters, err := portCounters(ctx, info, port); err != nil {
				fmt.Fprintf(w, "\t\t\tcounters:\t\tunavailable: %v\n", err)
			} else {
				fmt.Fprintf(w, "\t\t\tcounters:\n")
				for _, ct := range counters {
					fmt.Fprintf(w, "\t\t\t\t%s:%s%d\n", ct.Name, tabs(ct.Name, 4), ct.Value)
				}
			}
		}
		fmt.Fprintln(w) // ibv_devinfo ends each port with a blank line
	}
	return nil
}

// printGID prints the port's GID 0 (the one verbs reports) as ibv_devinfo
// prints a GID that is not null: a RoCE v2 GID as an IPv6 address, an
// InfiniBand or RoCE v1 one as eight groups of four hex digits, and on
// Ethernet ports its type after it.
func printGID(w io.Writer, info verbs.DeviceInfo, port uint8, pa verbs.PortAttr) {
	if [8]byte(pa.GID[8:]) == [8]byte{} {
		return // ibv_devinfo skips GIDs with a null interface ID
	}
	// A soft HCA's GIDs are RoCE v2 (its IP address); a kernel device's
	// type is in sysfs, as ibv_query_gid_type reads it.
	v2 := info.Driver == "soft"
	if !v2 {
		b, _ := os.ReadFile(filepath.Join(sysfsClass, info.Name, "ports", strconv.Itoa(int(port)),
			"gid_attrs", "types", "0"))
		v2 = strings.TrimSpace(string(b)) == "RoCE v2"
	}
	s, typ := pa.GID.String(), "RoCE v1"
	if v2 {
		s, typ = netip.AddrFrom16(pa.GID).String(), "RoCE v2"
	}
	if pa.LinkLayer == verbs.LinkLayerEthernet {
		s += ", " + typ
	}
	fmt.Fprintf(w, "\t\t\tGID[%3d]:\t\t%s\n", 0, s)
}

// boardID is a kernel device's board_id from sysfs, as ibv_devinfo reads
// it; "" for a software HCA, which has none.
func boardID(info verbs.DeviceInfo) string {
	if info.Driver == "soft" {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(sysfsClass, info.Name, "board_id"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// tabs pads a label indented by indent tabs to the value column, as
// ibv_devinfo's layout does: tab stops every 8 columns, device values at
// column 40, port values at 48, counters at 56.
func tabs(label string, indent int) string {
	target := map[int]int{1: 40, 3: 48, 4: 56}[indent]
	col := indent*8 + len(label) + 1
	n := 1
	for col = (col/8 + 1) * 8; col < target; col += 8 {
		n++
	}
	return strings.Repeat("\t", n)
}

func guid(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)
}

func atomicName(a verbs.AtomicCap) string {
	switch a {
	case verbs.AtomicNone:
		return "ATOMIC_NONE"
	case verbs.AtomicHCA:
		return "ATOMIC_HCA"
	case verbs.AtomicGlob:
		return "ATOMIC_GLOB"
	}
	return "invalid atomic capability"
}

// The names ibv_devinfo -v gives a port's encoded values (IBTA encodings
// of PortInfo), and what it says of a value it has no name for.
var (
	vlNames    = portNames{map[uint8]string{1: "1", 2: "2", 3: "4", 4: "8", 5: "15"}, "invalid value"}
	widthNames = portNames{map[uint8]string{1: "1", 2: "4", 4: "8", 8: "12", 16: "2"}, "invalid width"}
	speedNames = portNames{map[uint8]string{1: "2.5 Gbps", 2: "5.0 Gbps", 4: "10.0 Gbps", 8: "10.0 Gbps",
		16: "14.0 Gbps", 32: "25.0 Gbps", 64: "50.0 Gbps", 128: "100.0 Gbps"}, "invalid speed"}
	physStateNames = portNames{map[uint8]string{1: "SLEEP", 2: "POLLING", 3: "DISABLED",
		4: "PORT_CONFIGURATION TRAINNING", // ibv_devinfo's spelling
		5: "LINK_UP", 6: "LINK_ERROR_RECOVERY", 7: "PHY TEST"}, "invalid physical state"}
)

// portNames names the values of one encoded port attribute.
type portNames struct {
	names   map[uint8]string
	invalid string
}

func (n portNames) of(v uint8) string {
	if s, ok := n.names[v]; ok {
		return s
	}
	return n.invalid
}

// sysfsClass is where the kernel shows its RDMA devices (tests change it).
var sysfsClass = "/sys/class/infiniband"

// portCounters reads a port's counters: from the device service for a
// software HCA, from sysfs for a kernel device.
func portCounters(ctx context.Context, info verbs.DeviceInfo, port uint8) ([]softhca.Counter, error) {
	if info.Driver == "soft" {
		return softhca.QueryCounters(ctx, "", info.Name)
	}
	// The PMA's counters, and the driver's (hw_counters: retries,
	// sequence errors, ...), which a driver may not have.
	portDir := filepath.Join(sysfsClass, info.Name, "ports", strconv.Itoa(int(port)))
	var out []softhca.Counter
	for _, group := range []string{"counters", "hw_counters"} {
		dir := filepath.Join(portDir, group)
		ents, err := os.ReadDir(dir)
		if err != nil {
			if group == "counters" {
				return nil, err
			}
			continue
		}
		for _, e := range ents {
			if group == "hw_counters" && e.Name() == "lifespan" {
				continue // how long the driver caches them, in ms
			}
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				continue // some counters are not readable by everyone
			}
			v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
			if err == nil {
				out = append(out, softhca.Counter{Name: e.Name(), Value: v})
			}
		}
	}
	slices.SortFunc(out, func(a, b softhca.Counter) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
