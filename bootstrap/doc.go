// Package bootstrap is the TCP rendezvous through which the ranks of a job
// find each other: a server run by the launcher (or by rank 0 when ranks
// are started by something else) and a client per rank. Only members of
// the job, who hold its random key, can join.
//
// # Use
//
// The launcher listens, puts the address and the key into every rank's
// environment (Env.Environ) and serves:
//
//	srv, err := bootstrap.Listen(ctx, "0.0.0.0:0", bootstrap.ServerConfig{Size: n, Key: key})
//	go srv.Serve(ctx)
//	env := bootstrap.Env{..., Addr: srv.Addr(), Key: key}
//
// and each rank joins, exchanges its records and leaves:
//
//	c, env, err := bootstrap.FromEnv(ctx, bootstrap.ClientConfig{})
//	recs, err := c.AllGather(ctx, myEndpoint) // recs[r] is rank r's
//	...
//	c.Barrier(ctx) // the last collective: every rank is done
//	c.Close()      // a clean leave
//
// Without XRC_BOOTSTRAP in the environment FromEnv returns a world of one
// that needs no server.
//
// # Ranks started by something else
//
// When ranks are started by srun or another launcher that knows nothing of
// this package, rank 0 runs the server itself: it calls Listen on an
// address the others can reach, runs Serve in a goroutine, then Join like
// every rank. It publishes Addr (and the key, if the job has no shared
// secret already) out of band, through a file on a shared file system or
// the launcher's own key-value store (Slurm's PMI), and the other ranks
// Join that address with the same key. Rank 0 closes the server after its
// own client's Close, and not before the others are done: the final
// Barrier before Close assures that.
//
// # Semantics
//
// Join returns once all ranks have registered. Collectives (AllGather,
// Barrier) are numbered per rank in the order called and must be called
// in the same order by every rank; a rank calling Barrier where another
// called AllGather aborts the job. Put and Get are a write-once key-value
// store: Get waits until some rank puts the key; a Get whose context ends
// is withdrawn from the server (with the client's next message), so that
// polling for a key with short contexts costs the server nothing.
//
// The server bounds what one rank can make it hold: 65,536 gets waiting
// for keys nobody has put (their keys totalling 16 MiB at most), and 16
// collectives entered and not complete. A rank that calls Get and the
// collectives as a program with a few goroutines does never nears them; a
// request past them aborts the job with an *AbortError naming the rank
// (Blamed is then true, as for a rank that mismatched a collective or
// left one it had to take part in: the server aborted the job because of
// it; when Lost and Blamed are both false, the rank called Abort).
//
// A rank whose connection ends before it called Close aborts the job, and
// every other rank's client ends with an *AbortError naming it (Lost is
// then true), as a process that exits without MPI_Finalize aborts an MPI
// job. A rank that closes and is then needed by a collective it did not
// take part in aborts the job too. A lost server ends every client with
// an error wrapping ErrLost. Every call takes a context and returns when it
// ends.
//
// # Protocol
//
// Frames are a 1-byte type, a 4-byte length and a payload (wire.go). The
// handshake (handshake.go) carries a magic and version and proves the key
// both ways with HMAC-SHA256 over fresh nonces; the key never crosses the
// wire. Before the proofs, frames are limited to a few hundred bytes and
// the server reads under a deadline; after them, records are limited to
// MaxRecord. Oversized, truncated or garbled messages are rejected,
// counted (xrc_bootstrap_server_bad_messages_total) and logged. Only the
// handshake is authenticated: the stream after it is plain TCP, neither
// encrypted nor protected against a party that can rewrite packets
// between the ranks and the server.
//
// # Memory
//
// The package never keeps a caller's slice: Join, AllGather, Put and
// Listen copy what they are given before they return. Records and values
// returned are new memory owned by the caller, except Members' Endpoint
// records, which are shared and must not be modified.
package bootstrap
