package xrc

// TrySend sends one frame (the parts, concatenated) to rank as a
// SEND_WITH_IMM on the INI QP toward its node, naming its SRQ. It returns
// false when the rank has no buffer for it by this rank's credits, the
// INI QP's send queue is full (its entries are shared by every rank of the
// node, one kept free for credit messages), no send buffer is free or the
// connection is still being made. Frames up to the inline size are copied
// into the work request; larger ones into a registered send buffer. The
// parts are free when TrySend returns.
func (t *Transport) TrySend(rank int, parts ...[]byte) (bool, error) {
	return t.e.TrySend(rank, parts...)
}
