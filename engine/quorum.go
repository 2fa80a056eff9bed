package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// QuorumConfig configures a QuorumWatch.
type QuorumConfig struct {
	NC *nats.Conn
	JS jetstream.JetStream
	// Every is the time between two asks (default 2 s); After is how many
	// failed in a row move the connection (default 5: an election of
	// JetStream's meta leader, 2-9 s, does not).
	Every time.Duration
	After int
	Log   *slog.Logger
}

// QuorumWatch moves chime's connection off a server that cannot reach
// JetStream's leaders. Cut from its peers but not from its clients (the
// minority side of a partition), a server keeps answering pings, so the
// connection stays, while every JetStream request on it fails: the
// replica could not renew a lease, store a fire or write a record there.
// The watch asks JetStream for the account's info (answered by the meta
// leader) every Every; After failures in a row, on a connection that
// knows other servers, it reconnects to another one.
type QuorumWatch struct {
	c     QuorumConfig
	log   *slog.Logger
	fails int
}

// NewQuorumWatch returns a watch; Run runs it.
func NewQuorumWatch(c QuorumConfig) *QuorumWatch {
	if c.Every <= 0 {
		c.Every = 2 * time.Second
	}
	if c.After <= 0 {
		c.After = 5
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return &QuorumWatch{c: c, log: c.Log.With("component", "quorum")}
}

// Run asks until ctx ends.
func (q *QuorumWatch) Run(ctx context.Context) {
	t := time.NewTicker(q.c.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		q.check(ctx)
	}
}

// check asks once and moves the connection when the asks have failed
// After times in a row.
func (q *QuorumWatch) check(ctx context.Context) {
	if !q.c.NC.IsConnected() {
		q.fails = 0 // reconnecting already
		return
	}
	actx, cancel := context.WithTimeout(ctx, q.c.Every)
	_, err := q.c.JS.AccountInfo(actx)
	cancel()
	if err == nil || ctx.Err() != nil {
		q.fails = 0
		return
	}
	q.fails++
	if q.fails < q.c.After || len(q.c.NC.Servers()) < 2 {
		return
	}
	q.fails = 0
	q.log.Warn("the NATS server cannot reach JetStream's leaders: reconnecting to another server",
		"server", q.c.NC.ConnectedServerName(), "asks_failed", q.c.After, "last", err)
	if err := q.c.NC.ForceReconnect(); err != nil {
		q.log.Warn("reconnect", "err", err)
	}
}
