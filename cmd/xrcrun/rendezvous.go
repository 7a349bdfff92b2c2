package main

import (
	"context"
	"log/slog"
	"net"
	"sync"
)

// rendezvous is the job's bootstrap server, as the launcher uses it.
type rendezvous interface {
	Addr() string
	Serve(ctx context.Context) error
	Joined() int
	Abort(reason string)
	Close() error
}

// listenRendezvous starts the job's bootstrap server on addr (host:port).
//
// TODO(bootstrap): package bootstrap's server (bootstrap.Listen) has not
// landed on main yet. Until it does, this placeholder only holds a TCP
// port, so that ranks that do not use bootstrap can run; replace it with
//
//	return bootstrap.Listen(ctx, addr, bootstrap.ServerConfig{Size: size, Key: key, Logger: log})
func listenRendezvous(ctx context.Context, addr string, size int, key []byte, log *slog.Logger) (rendezvous, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &pendingServer{ln: ln}, nil
}

type pendingServer struct {
	ln   net.Listener
	once sync.Once
}

func (s *pendingServer) Addr() string { return s.ln.Addr().String() }
func (s *pendingServer) Serve(ctx context.Context) error {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return err
		}
		c.Close()
	}
}
func (s *pendingServer) Joined() int  { return 0 }
func (s *pendingServer) Abort(string) {}
func (s *pendingServer) Close() error { return s.ln.Close() }
