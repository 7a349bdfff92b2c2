package softhca_test

import (
	"encoding/binary"
	"hash/crc64"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/xrcrun/xrc/softhca"
	"github.com/xrcrun/xrc/verbs"
	"github.com/xrcrun/xrc/verbs/verbstest"
)

var crcTable = crc64.MakeTable(crc64.ECMA)

var cfgLogger *slog.Logger

// lossyEnv is two devices on UDP whose every packet, both ways, may be
// lost, duplicated or reordered.
func lossyEnv(f softhca.Faults, viaProcess bool) (verbstest.Env, *[2]*softhca.Device) {
	devs := new([2]*softhca.Device)
	return verbstest.Env{Name: "lossy UDP", Open: func(t testing.TB) (a, b *verbs.Context) {
		for i := range devs {
			f.Seed += uint64(i)
			devs[i] = newUDPDevice(t, softhca.Config{Faults: f, Logger: cfgLogger})
			if viaProcess {
				devs[i].ReachMemoryThroughProcess()
			}
		}
		return open(t, devs[0]), open(t, devs[1])
	}}, devs
}

// TestLossyLink sends messages of random sizes, and RDMA WRITEs and READs,
// over links that lose 10% of the packets, duplicate 5% and reorder 5%:
// every message arrives exactly once, in order, intact, and the counters
// show the retransmissions. XRC_LOSS_MESSAGES sets the number of SENDs
// (default 2000; the acceptance run uses 10000).
func TestLossyLink(t *testing.T) {
	n := 2000
	if s := os.Getenv("XRC_LOSS_MESSAGES"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	if testing.Short() {
		n = 200
	}
	devs := lossyLink(t, n, false, lossy)
	// Each side's counters show what the faults did to what it received:
	// gaps (out_of_sequence) and duplicates (duplicate_request) as a
	// responder, sequence NAKs as a requester.
	b, a := devs[1].Counters(), devs[0].Counters()
	if b.OutOfSequence.Load() == 0 || b.DuplicateRequest.Load() == 0 || a.PacketSeqErr.Load() == 0 {
		t.Errorf("receiver: out_of_sequence %d, duplicate_request %d; sender: packet_seq_err %d",
			b.OutOfSequence.Load(), b.DuplicateRequest.Load(), a.PacketSeqErr.Load())
	}
}

// lossy is the acceptance's faults: 10% loss, 5% duplication, 5% reordering.
var lossy = softhca.Faults{Loss: 0.10, Duplicate: 0.05, Reorder: 0.05, Seed: 7}

// TestFaultsSeparately runs each fault alone, with no loss: the receiver
// sees what it injects (a duplicate is acknowledged again, a packet held
// back makes a gap), and every message still arrives once, in order.
func TestFaultsSeparately(t *testing.T) {
	t.Run("Duplicate", func(t *testing.T) {
		devs := lossyLink(t, 100, false, softhca.Faults{Duplicate: 0.2, Seed: 3})
		if c := devs[1].Counters(); c.FaultDups.Load()+devs[0].Counters().FaultDups.Load() == 0 || c.DuplicateRequest.Load() == 0 {
			t.Errorf("duplicated %d packets; the receiver saw %d duplicate requests",
				c.FaultDups.Load()+devs[0].Counters().FaultDups.Load(), c.DuplicateRequest.Load())
		}
	})
	t.Run("Reorder", func(t *testing.T) {
		devs := lossyLink(t, 100, false, softhca.Faults{Reorder: 0.2, Seed: 3})
		if c := devs[1].Counters(); c.OutOfSequence.Load() == 0 {
			t.Errorf("reordered %d packets; the receiver saw none out of sequence", devs[0].Counters().FaultReorders.Load())
		}
	})
}

// TestLossyLinkThroughProcess is TestLossyLink with fewer SENDs, each from
// two pieces of memory, where the devices reach the memory regions with
// process_vm_readv/writev, as they reach Go memory in other processes:
// requests and READ responses are read, and READ responses written, in
// runs of packets (sendRequests, sendReads, writerun.go), through the same
// loss, duplication and reordering.
func TestLossyLinkThroughProcess(t *testing.T) {
	n := 200
	if testing.Short() {
		n = 50
	}
	lossyLink(t, n, true, lossy)
}

// lossyLink sends n SENDs, then the WRITEs and READs, over links with
// faults f, and returns the two devices.
func lossyLink(t *testing.T, n int, viaProcess bool, f softhca.Faults) *[2]*softhca.Device {
	env, devs := lossyEnv(f, viaProcess)
	const maxSize = 1 << 20
	pa, pb := verbstest.ConnectWith(t, env, 8<<20, verbstest.Options{Timeout: 8, MTU: verbs.MTU4096})
	rng := rand.New(rand.NewPCG(1, 2))
	wc := make([]verbs.WorkCompletion, 16)
	const slots = 4 // receive buffers of maxSize each, and as many messages in flight
	recv := func(i int) {
		if err := pb.QP.PostRecv(&verbs.RecvWR{WRID: uint64(i % slots), SG: []verbs.SGE{pb.MR.SGE((i%slots)*maxSize, maxSize)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range slots {
		recv(i)
	}
	sizes := make([]int, n)
	sums := make([]uint64, n)
	sent, got, sendDone := 0, 0, 0
	deadline := time.Now().Add(10 * time.Minute)
	for got < n || sendDone < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages after 10 minutes", got, n)
		}
		// Keep up to slots messages in flight.
		for sent < n && sent-got < slots && sent-sendDone < slots {
			size := 16 + rng.IntN(maxSize-16)
			slot := pa.Buf[(sent%slots)*maxSize : (sent%slots)*maxSize+size]
			for j := 8; j+8 <= size; j += 8 {
				binary.LittleEndian.PutUint64(slot[j:], rng.Uint64())
			}
			binary.LittleEndian.PutUint64(slot, uint64(sent))
			sizes[sent], sums[sent] = size, crc64.Checksum(slot, crcTable)
			sg := []verbs.SGE{pa.MR.SGE((sent%slots)*maxSize, size)}
			if viaProcess {
				// Two pieces, so that runs of packets read from
				// memory start and end inside them.
				third := size / 3
				sg = []verbs.SGE{pa.MR.SGE((sent%slots)*maxSize, third), pa.MR.SGE((sent%slots)*maxSize+third, size-third)}
			}
			if err := pa.QP.PostSend(&verbs.SendWR{WRID: uint64(sent), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
				SG: sg}); err != nil {
				t.Fatal(err)
			}
			sent++
		}
		k, err := pa.CQ.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range wc[:k] {
			if c.Status != verbs.WCSuccess || c.WRID != uint64(sendDone) {
				t.Fatalf("send completion %+v, want wr_id %d", c, sendDone)
			}
			sendDone++
		}
		k2, err := pb.CQ.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if k+k2 == 0 {
			// Nothing yet: sleep rather than spin, so that the devices'
			// socket readers, which share this process's two CPUs, run.
			time.Sleep(20 * time.Microsecond)
		}
		for _, c := range wc[:k2] {
			if c.Status != verbs.WCSuccess || c.WRID != uint64(got%slots) || int(c.ByteLen) != sizes[got] {
				t.Fatalf("receive %d: %+v, want %d bytes", got, c, sizes[got])
			}
			msg := pb.Buf[(got%slots)*maxSize : (got%slots)*maxSize+sizes[got]]
			if seq := binary.LittleEndian.Uint64(msg); seq != uint64(got) {
				t.Fatalf("receive %d carries message %d", got, seq)
			}
			if crc64.Checksum(msg, crcTable) != sums[got] {
				t.Fatalf("message %d: checksum differs", got)
			}
			got++
			if got+slots-1 < n {
				recv(got + slots - 1)
			}
		}
	}
	// RDMA WRITE then READ back, with checksums, through the same loss.
	for i := range 20 {
		size := 1 + rng.IntN(2<<20)
		src := pa.Buf[:size]
		for j := range src {
			src[j] = byte(rng.Uint32())
		}
		sum := crc64.Checksum(src, crcTable)
		post := func(op verbs.WROpcode, local int) {
			if err := pa.QP.PostSend(&verbs.SendWR{WRID: uint64(i), Opcode: op, Flags: verbs.SendSignaled,
				SG: []verbs.SGE{pa.MR.SGE(local, size)}, RemoteAddr: pb.MR.Addr() + 4<<20, RKey: pb.MR.RKey()}); err != nil {
				t.Fatal(err)
			}
			for {
				k, err := pa.CQ.Poll(wc[:1])
				if err != nil {
					t.Fatal(err)
				}
				if k == 0 {
					time.Sleep(20 * time.Microsecond)
				}
				if k == 1 {
					want := map[verbs.WROpcode]verbs.WCOpcode{verbs.WRRDMAWrite: verbs.WCRDMAWrite, verbs.WRRDMARead: verbs.WCRDMARead}[op]
					if wc[0].Status != verbs.WCSuccess || wc[0].WRID != uint64(i) || wc[0].Opcode != want {
						t.Fatalf("%v %d: %+v", op, i, wc[0])
					}
					return
				}
			}
		}
		post(verbs.WRRDMAWrite, 0)
		if crc64.Checksum(pb.Buf[4<<20:4<<20+size], crcTable) != sum {
			bad := map[int]int{}
			for j := range size {
				if pb.Buf[4<<20+j] != src[j] {
					bad[j/4096]++
				}
			}
			t.Fatalf("write %d of %d bytes: checksum differs in packets %v; dst %x src %x", i, size, bad, pb.Buf[4<<20:4<<20+8], src[:8])
		}
		post(verbs.WRRDMARead, 4<<20)
		if crc64.Checksum(pa.Buf[4<<20:4<<20+size], crcTable) != sum {
			t.Fatalf("read %d: checksum differs", i)
		}
	}
	for i, d := range devs {
		c := d.Counters()
		t.Logf("device %d: sent %d packets, dropped %d, duplicated %d, reordered %d; retransmitted %d, duplicates received %d, sequence NAKs %d, timeouts %d (%d late)",
			i, c.XmitPackets.Load(), c.FaultDrops.Load(), c.FaultDups.Load(), c.FaultReorders.Load(),
			c.Retransmits.Load(), c.DuplicateRequest.Load(), c.PacketSeqErr.Load(), c.AckTimeouts.Load(), c.LateTimeouts.Load())
	}
	if f.Loss > 0 && (devs[0].Counters().Retransmits.Load() == 0 || devs[0].Counters().FaultDrops.Load() == 0) {
		t.Fatal("no retransmissions counted under loss")
	}
	return devs
}

// sendSignaled sends 100 bytes with wr_id and waits for the completion,
// which it returns.
func sendSignaled(t *testing.T, pa verbstest.Endpoint, wrID uint64) []verbs.WorkCompletion {
	t.Helper()
	if err := pa.QP.PostSend(&verbs.SendWR{WRID: wrID, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SG: []verbs.SGE{pa.MR.SGE(0, 100)}}); err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WorkCompletion, 1)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Microsecond) {
		n, err := pa.CQ.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return wc
		}
		if time.Now().After(deadline) {
			t.Fatal("no completion after 30 s")
		}
	}
}

// TestStalledPeer: a peer that answers 120 ms late, as one whose process
// waits that long for a CPU on a loaded host, does not fail a QP with a
// 1 ms timeout and 7 retries: the timer backs off (Device.rto).
func TestStalledPeer(t *testing.T) {
	env, devs := lossyEnv(softhca.Faults{Delay: 1, DelayBy: 60 * time.Millisecond, Seed: 5}, false)
	pa, pb := verbstest.ConnectWith(t, env, 4096, verbstest.Options{Timeout: 8, RetryCnt: 7}) // 1 ms
	if err := pb.QP.PostRecv(&verbs.RecvWR{WRID: 1, SG: []verbs.SGE{pb.MR.SGE(0, 4096)}}); err != nil {
		t.Fatal(err)
	}
	wc := sendSignaled(t, pa, 5)
	if wc[0].Status != verbs.WCSuccess || wc[0].WRID != 5 {
		t.Fatalf("completion %+v, want success", wc[0])
	}
	if c := devs[0].Counters(); c.AckTimeouts.Load() == 0 {
		t.Error("no timeout while the peer's answers were late")
	}
}

// TestTotalLoss: on a link that loses every packet, a send fails with
// RETRY_EXC_ERR after the QP's retry count: the transport timer fires once
// for the first try and once per retry.
func TestTotalLoss(t *testing.T) {
	env, devs := lossyEnv(softhca.Faults{Loss: 1, Seed: 3}, false)
	const retries = 3
	pa, _ := verbstest.ConnectWith(t, env, 4096, verbstest.Options{Timeout: 8, RetryCnt: retries}) // 1 ms
	wc := sendSignaled(t, pa, 5)
	if wc[0].Status != verbs.WCRetryExcErr || wc[0].WRID != 5 {
		t.Fatalf("completion %+v, want RETRY_EXC_ERR", wc[0])
	}
	c := devs[0].Counters()
	// Timeouts handled late (the test process stalled on a loaded
	// machine) do not count against the retries.
	if got := c.AckTimeouts.Load() - c.LateTimeouts.Load(); got != retries+1 {
		t.Errorf("transport timer fired %d times on time, want %d", got, retries+1)
	}
	// local_ack_timeout_err counts the expirations that sent again (the
	// retry limit not exceeded), req_transport_retries_exceeded the last.
	if got, want := c.LocalAckTimeoutErr.Load(), c.AckTimeouts.Load()-1; got != want {
		t.Errorf("local_ack_timeout_err %d, want %d", got, want)
	}
	if got := counterNamed(c, "req_transport_retries_exceeded"); got != 1 {
		t.Errorf("req_transport_retries_exceeded %d, want 1", got)
	}
	if c.Retransmits.Load() < retries || c.FaultDrops.Load() < retries+1 {
		t.Errorf("retransmitted %d, dropped %d", c.Retransmits.Load(), c.FaultDrops.Load())
	}
}

// counterNamed returns the value of the device counter of the given name.
func counterNamed(c *softhca.Counters, name string) uint64 {
	var v uint64
	c.Each(func(n, _ string, x uint64) {
		if n == name {
			v = x
		}
	})
	return v
}
