// Package liveness owns how a NATS connection notices, within seconds, a
// server it can no longer reach: chime's own connections and the ones the
// Go client recommends to agents carry the same options.
package liveness

import (
	"time"

	"github.com/nats-io/nats.go"
)

// A ping every PingInterval, and the connection is given up (and another
// server tried) when MaxPingsOutstanding go unanswered, 4-6 s after a cut;
// or when a write stalls for WriteStall.
const (
	PingInterval        = 2 * time.Second
	MaxPingsOutstanding = 2
	// WriteStall bounds one write to the server. A busy connection fills
	// its socket's send buffer within moments of a cut, and nats.go's
	// flusher then blocks in the write holding the connection's lock,
	// which the ping timer needs too: no ping goes out or counts as
	// unanswered until the write gives up (measured: a replica stuck on a
	// cut-off server for the whole 20 s cut, until the heal reset the
	// socket).
	WriteStall = 2 * PingInterval
)

// Options are the nats.Connect options that give a connection these
// bounds. A server cut off by the network does not close the socket:
// without them the connection looks up for nats.go's default 2 minutes
// while every request on it times out.
func Options() []nats.Option {
	return []nats.Option{
		nats.PingInterval(PingInterval),
		nats.MaxPingsOutstanding(MaxPingsOutstanding),
		nats.FlusherTimeout(WriteStall),
		nats.ReconnectOnFlusherError(),
	}
}
