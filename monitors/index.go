package monitors

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvwatch"
)

// Index counts, per agent, the running monitors, for the per-agent limit.
// Every replica keeps one, from a KV watch of the monitor records, so a
// count costs no storage read. It lags the records by the watch's delay:
// concurrent starts of one agent may pass the limit by what is in flight.
type Index struct {
	watch *kvwatch.Watch

	mu      sync.Mutex
	running map[string]string // record key -> agent, of running monitors
	agents  map[string]int    // agent -> its running monitors
	// watched are the monitors a sweep may have to act on: running ones
	// (with their deadlines) and stopped ones not yet delivered.
	watched map[string]watched
}

// watched is what the sweep needs of a monitor.
type watched struct {
	Due
	running  bool
	deadline time.Time // the earlier of its timeout and idle deadline; zero: none
	source   Source
}

// Watched is a running monitor of an in-chime source: Key is its record's.
type Watched struct {
	Due
	Key    string
	Source Source
}

// Due names a monitor a sweep looks at.
type Due struct {
	AgentID, MonitorID string
}

// NewIndex returns the count of the monitors bucket; Start loads it.
func NewIndex(js jetstream.JetStream, bucket string, log *slog.Logger) *Index {
	ix := &Index{running: map[string]string{}, agents: map[string]int{}, watched: map[string]watched{}}
	ix.watch = kvwatch.New(kvwatch.Config{JS: js, Bucket: bucket, Keys: "*.*", Apply: ix.apply, Reset: ix.reset, Log: log})
	return ix
}

// Start watches the bucket and returns once its records are counted; ctx
// bounds only that. The watch runs until Stop.
func (ix *Index) Start(ctx context.Context) error {
	if err := ix.watch.StartLoaded(ctx); err != nil {
		return fmt.Errorf("monitors: index: %w", err)
	}
	return nil
}

// Stop ends the watch. Idempotent and safe without Start.
func (ix *Index) Stop(ctx context.Context) error { return ix.watch.Stop(ctx) }

// WaitSeen returns once the count holds the bucket's revision rev, ctx
// ends or the watch stops.
func (ix *Index) WaitSeen(ctx context.Context, rev uint64) error { return ix.watch.WaitSeen(ctx, rev) }

// Running is how many of the agent's monitors run.
func (ix *Index) Running(agentID string) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.agents[agentID]
}

func (ix *Index) reset() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.running, ix.agents, ix.watched = map[string]string{}, map[string]int{}, map[string]watched{}
}

// RunningOf lists the running monitors whose source is of type typ.
func (ix *Index) RunningOf(typ string) []Watched {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var out []Watched
	for k, w := range ix.watched {
		if w.running && w.source.Type == typ {
			out = append(out, Watched{Due: w.Due, Key: k, Source: w.source})
		}
	}
	return out
}

// Due lists the monitors a sweep at now has to look at: running ones past
// their timeout or idle deadline (as last seen), and stopped ones whose
// monitor_stopped is not delivered yet.
func (ix *Index) Due(now time.Time) []Due {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var out []Due
	for _, w := range ix.watched {
		if !w.running || (!w.deadline.IsZero() && !now.Before(w.deadline)) {
			out = append(out, w.Due)
		}
	}
	return out
}

func (ix *Index) apply(e kvwatch.Entry) {
	agentID, _, ok := strings.Cut(e.Key, ".")
	if !ok {
		return
	}
	var m Monitor
	read := !e.Deleted && json.Unmarshal(e.Value, &m) == nil
	now := read && m.Status == Running
	ix.mu.Lock()
	defer ix.mu.Unlock()
	switch {
	case now:
		w := watched{Due: Due{AgentID: agentID, MonitorID: m.ID}, running: true, deadline: m.IdleDeadline(), source: m.Source}
		if m.ExpiresAt != nil && (w.deadline.IsZero() || m.ExpiresAt.Before(w.deadline)) {
			w.deadline = *m.ExpiresAt
		}
		ix.watched[e.Key] = w
	case read && m.Finished() && m.DeliveredAt == nil:
		ix.watched[e.Key] = watched{Due: Due{AgentID: agentID, MonitorID: m.ID}}
	default:
		delete(ix.watched, e.Key)
	}
	_, was := ix.running[e.Key]
	switch {
	case now && !was:
		ix.running[e.Key] = agentID
		ix.agents[agentID]++
	case !now && was:
		delete(ix.running, e.Key)
		if ix.agents[agentID]--; ix.agents[agentID] <= 0 {
			delete(ix.agents, agentID)
		}
	}
}
