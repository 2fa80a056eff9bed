package monitors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Checker says whether an agent may watch a source's value. A replica
// serves a source type when its Store has a Checker for it (the command
// source, run by an executor outside chime, needs none).
type Checker interface {
	Check(agentID, value string) error
}

// A Starter is a Checker whose source keeps cursors and starts from one
// taken at monitor.start (a KV bucket's last revision): the watch, begun
// later on the shard's owner, then misses nothing after the start was
// acknowledged.
type Starter interface {
	Start(ctx context.Context, agentID, value string) (cursor string, err error)
}

// A Feed is a source chime watches itself, on the replica holding the
// monitor's shard: Run sends the source's lines to sink from where the
// record's Cursor says the last batch applied left off ("" at the start),
// until ctx ends (nil or ctx's error) or the source ends by itself
// (*SourceEnded). A Feed that keeps cursors resumes a moved monitor
// without losing or repeating a line the record counted.
type Feed interface {
	Run(ctx context.Context, m *Monitor, sink *Sink) error
}

// Item is one line of an in-chime source and the source's position after
// it (Cursor; "" for a source that keeps none, such as a core NATS
// subscription).
type Item struct {
	Line   string
	Cursor string
}

// Sink takes a Feed's lines to the watch's batches.
type Sink struct {
	items   chan Item
	dropped atomic.Int64
	// mu keeps Offer, called from a subscription's callbacks, off the
	// channel once close has closed it.
	mu     sync.RWMutex
	closed bool
}

// close ends the items once the Feed has returned: the batches flush
// what they hold and the watch ends.
func (s *Sink) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.items)
	}
}

func newSink(n int) *Sink { return &Sink{items: make(chan Item, n)} }

// Send hands it on, waiting while the batches are being applied: a
// source that can wait (a KV watch, a poll) loses nothing.
func (s *Sink) Send(ctx context.Context, it Item) error {
	it.Line = CapLine(it.Line)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ctx.Err()
	}
	select {
	case s.items <- it:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Offer hands it on if there is room, and otherwise drops it, counted as
// suppressed in the next batch: for a source that cannot wait (a core
// NATS subscription, a WebSocket reader).
func (s *Sink) Offer(it Item) {
	it.Line = CapLine(it.Line)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return
	}
	select {
	case s.items <- it:
	default:
		s.dropped.Add(1)
	}
}

// SourceEnded is a Feed's end of its own accord (a WebSocket closed, a
// URL gone): the monitor stops with reason source_ended and Code as its
// exit code when set.
type SourceEnded struct {
	Code *int
	Why  string
}

func (e *SourceEnded) Error() string {
	if e.Code != nil {
		return fmt.Sprintf("source ended (%d): %s", *e.Code, e.Why)
	}
	return "source ended: " + e.Why
}

// errResync ends a watch whose record moved past it (another replica
// applied its batch): the next reconcile starts it again from the record.
var errResync = errors.New("monitor record moved on: resync from it")

// orDefault is d, or def when d is not set (a feed's optional settings).
func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
