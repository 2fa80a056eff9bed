package callbacks

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/internal/kvwatch"
)

// Index is a replica's in-memory view of the triggers and agents buckets,
// kept by KV watches (internal/kvwatch), so that a callback is checked
// without a storage round trip. Writes through the Store wait until the
// index has seen them, so this replica never accepts a token it has just
// revoked; another replica may for its watch's latency (well under a
// millisecond here). While either watch is not live (a leader change, a
// lost connection) the index refuses every token: stale, it could accept a
// revoked one.
type Index struct {
	log *slog.Logger

	mu       sync.Mutex
	tokens   map[string]tokenRef // by token hash
	triggers map[string]Trigger  // by record key
	agents   map[string]agents.AgentStatus

	watches map[string]*kvwatch.Watch // by bucket
	list    []*kvwatch.Watch
	once    sync.Once
}

// NewIndex returns the view of both buckets; Start loads it.
func NewIndex(js jetstream.JetStream, triggersBucket, agentsBucket string, log *slog.Logger) *Index {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ix := &Index{
		log: log.With("component", "triggers"), tokens: map[string]tokenRef{}, triggers: map[string]Trigger{},
		agents: map[string]agents.AgentStatus{}, watches: map[string]*kvwatch.Watch{},
	}
	for bucket, apply := range map[string]func(string, []byte, bool){triggersBucket: ix.applyTrigger, agentsBucket: ix.applyAgent} {
		w := kvwatch.New(kvwatch.Config{
			JS: js, Bucket: bucket, Log: log,
			Apply: func(e kvwatch.Entry) {
				ix.mu.Lock()
				apply(e.Key, e.Value, e.Deleted)
				ix.mu.Unlock()
			},
			Reset: func() { ix.reset(bucket == agentsBucket) },
		})
		ix.watches[bucket], ix.list = w, append(ix.list, w)
	}
	return ix
}

// Start watches both buckets and returns once their current contents are
// loaded; ctx bounds only that. The watches run until Stop.
func (ix *Index) Start(ctx context.Context) error {
	for _, w := range ix.list {
		if err := w.Start(context.WithoutCancel(ctx)); err != nil {
			_ = ix.Stop(ctx)
			return fmt.Errorf("triggers: %w", err)
		}
	}
	for _, w := range ix.list {
		select {
		case <-w.Loaded():
		case <-ctx.Done():
			_ = ix.Stop(ctx)
			return fmt.Errorf("triggers: loading the index: %w", ctx.Err())
		}
	}
	return nil
}

// Stop ends the watches. Idempotent and safe without Start.
func (ix *Index) Stop(ctx context.Context) error {
	ix.once.Do(func() {
		for _, w := range ix.list {
			_ = w.Stop(ctx)
		}
	})
	return nil
}

// reset forgets one bucket's view: it is being reloaded.
func (ix *Index) reset(agentsBucket bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if agentsBucket {
		ix.agents = map[string]agents.AgentStatus{}
		return
	}
	ix.tokens, ix.triggers = map[string]tokenRef{}, map[string]Trigger{}
}

// live reports whether every watch is live.
func (ix *Index) live() bool {
	live, _ := kvwatch.AllLive(ix.list...)
	return live
}

// applyAgent folds an agents-bucket change in. Called with ix.mu held.
func (ix *Index) applyAgent(key string, value []byte, deleted bool) {
	var st agents.AgentState
	if deleted || json.Unmarshal(value, &st) != nil {
		delete(ix.agents, key)
		return
	}
	ix.agents[key] = st.Status
}

// applyTrigger folds a triggers-bucket change in. Called with ix.mu held.
func (ix *Index) applyTrigger(key string, value []byte, deleted bool) {
	if hash, ok := strings.CutPrefix(key, "tok."); ok {
		var ref tokenRef
		if deleted || json.Unmarshal(value, &ref) != nil {
			delete(ix.tokens, hash)
			return
		}
		ix.tokens[hash] = ref
		return
	}
	var t Trigger
	if deleted || json.Unmarshal(value, &t) != nil {
		delete(ix.triggers, key)
		return
	}
	ix.triggers[key] = t
}

// waitSeen blocks until the index has applied revision rev of bucket.
func (ix *Index) waitSeen(ctx context.Context, bucket string, rev uint64) error {
	w, ok := ix.watches[bucket]
	if !ok {
		return fmt.Errorf("triggers: no index of bucket %s", bucket)
	}
	if err := w.WaitSeen(ctx, rev); err != nil {
		return fmt.Errorf("triggers: index: %w", err)
	}
	return nil
}

// resolve checks a token hash against the index, as Store.Resolve does.
func (ix *Index) resolve(hash string, mode DeliveryMode) (*Trigger, bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ref, ok := ix.tokens[hash]
	if !ok || !ix.live() {
		return nil, false
	}
	t, ok := ix.triggers[recKey(ref.AgentID, ref.TriggerID)]
	if !ok || !usable(&t, hash, mode) || ix.agents[t.AgentID] != agents.AgentActive {
		return nil, false
	}
	return &t, true
}

// active lists the agent's active triggers.
func (ix *Index) active(agentID string) []Trigger {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var out []Trigger
	for _, t := range ix.triggers {
		if t.AgentID == agentID && t.Status == TriggerActive {
			out = append(out, t)
		}
	}
	return out
}
