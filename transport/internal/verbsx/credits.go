package verbsx

// Credits travel in the immediate data of every SEND: the low 31 bits are
// how many frames of the receiver the sender has consumed (modulo 2^31);
// the top bit marks a credit message, which carries no frame and consumes
// no credit.
const (
	CreditMask = 1<<31 - 1
	CreditOnly = 1 << 31
)

// Credits is the flow control of the frames between this rank and one
// peer, both ways, counted modulo 2^31: frames sent to the peer and how
// many of them it said it consumed; frames of the peer consumed here, and
// the count last told to it. A frame counts as consumed once its receive
// buffer is posted again (Release), not when it is delivered: a credit
// told before would let the peer send into a buffer not yet there. Owned
// by the goroutine driving the transport.
type Credits struct {
	sent, peerFreed  uint32
	freed, announced uint32
	held             uint32 // delivered, their buffers not posted again yet
}

// Shares divides an SRQ of depth buffers among remotes senders: each may
// have credits frames unconsumed (an equal share minus 3 buffers held back
// for credit messages, at least 2, overcommitting the SRQ, and relying on
// RNR, when there are more peers than buffers); a credit message is worth
// sending once refund frames were consumed.
func Shares(depth, remotes int) (credits, refund uint32) {
	if remotes > 0 {
		credits = uint32(max(2, depth/remotes-3))
	}
	return credits, max(1, credits/2)
}

// Outstanding is the frames sent to the peer and not known consumed.
func (c *Credits) Outstanding() uint32 { return (c.sent - c.peerFreed) & CreditMask }

// Owed is the frames of the peer consumed and not told yet.
func (c *Credits) Owed() uint32 { return (c.freed - c.announced) & CreditMask }

// SendImm is the immediate data of a frame to the peer. Call Sent once it
// is posted.
func (c *Credits) SendImm() uint32 { return c.freed & CreditMask }

// Sent counts a frame posted to the peer, which carried SendImm.
func (c *Credits) Sent() { c.sent++; c.announced = c.freed }

// CreditImm is the immediate data of a credit message. Call Announced once
// it is posted.
func (c *Credits) CreditImm() uint32 { return CreditOnly | c.freed&CreditMask }

// Announced counts a credit message posted, which carried CreditImm.
func (c *Credits) Announced() { c.announced = c.freed }

// Received takes the immediate data of a SEND from the peer and reports
// whether it carries a frame (which the caller delivers) rather than
// credits alone.
func (c *Credits) Received(imm uint32) bool {
	c.peerFreed = imm & CreditMask
	if imm&CreditOnly != 0 {
		return false
	}
	c.held++
	return true
}

// Release counts the frames received since the last Release as consumed:
// their receive buffers are posted again.
func (c *Credits) Release() { c.freed += c.held; c.held = 0 }
