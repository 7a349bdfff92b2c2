package rc

// TrySend sends one frame (the parts, concatenated) to rank as a
// SEND_WITH_IMM. It returns false when the peer has no buffer for it by
// this rank's credits, the QP's send queue is full, no send buffer is free
// or the QP is still connecting. Frames up to the inline size are copied
// into the work request; larger ones into a registered send buffer. The
// parts are free when TrySend returns.
func (t *Transport) TrySend(rank int, parts ...[]byte) (bool, error) {
	return t.e.TrySend(rank, parts...)
}
