package bootstrap

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
)

// The handshake, before which neither side trusts the other:
//
//	rank → server  hello:     magic, version, client nonce Nc
//	server → rank  challenge: magic, version, server nonce Ns,
//	                          HMAC-SHA256(key, "xrc-bootstrap v1 server" || Nc || Ns)
//	rank → server  auth:      HMAC-SHA256(key, "xrc-bootstrap v1 client" || Ns || Nc)
//	rank → server  register:  rank, size, node, local rank, endpoint
//	server → rank  ready (member table, once every rank registered) or reject
//
// The server proves the key first, over the rank's fresh nonce, so a rank
// sends nothing keyed to an impostor; the distinct labels stop either
// proof from being replayed as the other. The key never crosses the wire.
// Frames before the proofs are limited to maxPreAuth bytes, and the
// server reads them under a deadline.

const (
	labelServer = "xrc-bootstrap v1 server"
	labelClient = "xrc-bootstrap v1 client"
)

func proof(key []byte, label string, a, b []byte) (p [proofLen]byte) {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(label))
	h.Write(a)
	h.Write(b)
	h.Sum(p[:0])
	return p
}

// rejectError maps a server's rejection to the client's errors.
func rejectError(m *msgReject) error {
	switch m.Code {
	case rejectAuth:
		return fmt.Errorf("%w: the server refused the job key: %s", ErrAuth, m.Text)
	case rejectRegister:
		return fmt.Errorf("%w: %s", ErrRejected, m.Text)
	case rejectAborted:
		return fmt.Errorf("%w before this rank joined (the server says: %s)", ErrAborted, m.Text)
	}
	return fmt.Errorf("%w: the server says: %s", ErrProtocol, m.Text)
}

// acceptHandshake runs the server's side up to the rank's registration,
// which it returns (its Endpoint aliases a buffer the caller then owns).
// rnd supplies the server's nonce.
func acceptHandshake(fc *frameConn, key []byte, rnd io.Reader) (*msgRegister, error) {
	t, p, err := fc.read(maxPreAuth)
	if err != nil {
		return nil, err
	}
	hello, err := expect[*msgHello](t, p, tHello)
	if err != nil {
		return nil, err
	}
	if string(hello.Magic[:]) != magic || hello.Version != protoVersion {
		text := fmt.Sprintf("this server speaks %s version %d, not %q version %d", magic, protoVersion, hello.Magic[:], hello.Version)
		fc.send(&msgReject{Code: rejectProtocol, Text: cut(text, 200)})
		return nil, protoErr("version", "%s", text)
	}
	ch := msgChallenge{Version: protoVersion}
	copy(ch.Magic[:], magic)
	if _, err := io.ReadFull(rnd, ch.Nonce[:]); err != nil {
		return nil, fmt.Errorf("bootstrap: nonce: %w", err)
	}
	ch.Proof = proof(key, labelServer, hello.Nonce[:], ch.Nonce[:])
	if err := fc.send(&ch); err != nil {
		return nil, err
	}
	t, p, err = fc.read(maxPreAuth)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: the peer left after the challenge (a wrong key?)", ErrAuth)
		}
		return nil, err
	}
	auth, err := expect[*msgAuth](t, p, tAuth)
	if err != nil {
		return nil, err
	}
	want := proof(key, labelClient, ch.Nonce[:], hello.Nonce[:])
	if !hmac.Equal(auth.Proof[:], want[:]) {
		err := fmt.Errorf("%w: the peer does not hold the job key", ErrAuth)
		fc.send(&msgReject{Code: rejectAuth, Text: "wrong job key"})
		return nil, err
	}
	t, p, err = fc.read(maxFromRank)
	if err != nil {
		return nil, err
	}
	return expect[*msgRegister](t, p, tRegister)
}

// dialHandshake runs the rank's side up to, not including, its
// registration. rnd supplies the rank's nonce.
func dialHandshake(fc *frameConn, key []byte, rnd io.Reader) error {
	hello := msgHello{Version: protoVersion}
	copy(hello.Magic[:], magic)
	if _, err := io.ReadFull(rnd, hello.Nonce[:]); err != nil {
		return fmt.Errorf("bootstrap: nonce: %w", err)
	}
	if err := fc.send(&hello); err != nil {
		return err
	}
	ch, err := expectOrReject[*msgChallenge](fc, maxPreAuth, tChallenge)
	if err != nil {
		return err
	}
	if string(ch.Magic[:]) != magic || ch.Version != protoVersion {
		return protoErr("version", "the server speaks %q version %d, this rank %s version %d", ch.Magic[:], ch.Version, magic, protoVersion)
	}
	want := proof(key, labelServer, hello.Nonce[:], ch.Nonce[:])
	if !hmac.Equal(ch.Proof[:], want[:]) {
		return fmt.Errorf("%w: the server does not hold the job key (a wrong key, or not this job's server)", ErrAuth)
	}
	return fc.send(&msgAuth{Proof: proof(key, labelClient, ch.Nonce[:], hello.Nonce[:])})
}
