package verbsx

// Work request ids of the verbs transports: the kind in the top byte, an
// index below.
const (
	WRRecv   uint64 = 1 << 56 // index: the receive buffer
	WRSend   uint64 = 2 << 56 // index: the send slot, or NoSlot (inline)
	WRCredit uint64 = 3 << 56 // a credit message
	WRRead   uint64 = 4 << 56 // index: the read operation
	WRKind   uint64 = 0xff << 56
)

// wrName names the kind of a send queue's work request, for errors.
func wrName(id uint64) string {
	switch id & WRKind {
	case WRSend:
		return "send"
	case WRCredit:
		return "credit"
	case WRRead:
		return "RDMA READ"
	}
	return "unknown"
}
