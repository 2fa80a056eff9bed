package monitors

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"

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
}

// NewIndex returns the count of the monitors bucket; Start loads it.
func NewIndex(js jetstream.JetStream, bucket string, log *slog.Logger) *Index {
	ix := &Index{running: map[string]string{}, agents: map[string]int{}}
	ix.watch = kvwatch.New(kvwatch.Config{JS: js, Bucket: bucket, Keys: "*.*", Apply: ix.apply, Reset: ix.reset, Log: log})
	return ix
}

// Start watches the bucket and returns once its records are counted; ctx
// bounds only that. The watch runs until Stop.
func (ix *Index) Start(ctx context.Context) error {
	if err := ix.watch.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("monitors: index: %w", err)
	}
	select {
	case <-ix.watch.Loaded():
		return nil
	case <-ctx.Done():
		_ = ix.Stop(ctx)
		return fmt.Errorf("monitors: loading the index: %w", ctx.Err())
	}
}

// Stop ends the watch. Idempotent and safe without Start.
func (ix *Index) Stop(ctx context.Context) error { return ix.watch.Stop(ctx) }

// Running is how many of the agent's monitors run.
func (ix *Index) Running(agentID string) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.agents[agentID]
}

func (ix *Index) reset() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.running, ix.agents = map[string]string{}, map[string]int{}
}

func (ix *Index) apply(e kvwatch.Entry) {
	agentID, _, ok := strings.Cut(e.Key, ".")
	if !ok {
		return
	}
	var m struct {
		Status Status `json:"status"`
	}
	now := !e.Deleted && json.Unmarshal(e.Value, &m) == nil && m.Status == Running
	ix.mu.Lock()
	defer ix.mu.Unlock()
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
