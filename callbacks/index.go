package callbacks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/subjects"
)

// Index is a replica's in-memory view of the triggers and agents buckets,
// kept by KV watches, so that a callback is checked without a storage
// round trip. Writes through the Store wait until the index has seen
// them, so this replica never accepts a token it has just revoked; another
// replica may for the watch's latency (well under a millisecond here).
type Index struct {
	log *slog.Logger

	mu       sync.Mutex
	changed  *sync.Cond
	tokens   map[string]tokenRef         // by token hash
	triggers map[string]subjects.Trigger // by record key
	agents   map[string]subjects.AgentStatus
	seen     map[string]uint64 // bucket -> highest revision applied
	ready    chan struct{}
	wg       sync.WaitGroup
	err      error
}

// errWatchClosed marks an index whose watch ended under it.
var errWatchClosed = errors.New("watch closed")

// StartIndex watches both buckets and returns once their current contents
// are loaded. The watches end with ctx.
func StartIndex(ctx context.Context, triggersKV, agentsKV jetstream.KeyValue, log *slog.Logger) (*Index, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ix := &Index{
		log: log.With("component", "triggers"), tokens: map[string]tokenRef{}, triggers: map[string]subjects.Trigger{},
		agents: map[string]subjects.AgentStatus{}, seen: map[string]uint64{}, ready: make(chan struct{}),
	}
	ix.changed = sync.NewCond(&ix.mu)
	loading := sync.WaitGroup{}
	for _, b := range []struct {
		kv    jetstream.KeyValue
		apply func(key string, value []byte, deleted bool)
	}{{triggersKV, ix.applyTrigger}, {agentsKV, ix.applyAgent}} {
		w, err := b.kv.WatchAll(ctx)
		if err != nil {
			return nil, fmt.Errorf("triggers: watch %s: %w", b.kv.Bucket(), err)
		}
		loading.Add(1)
		ix.wg.Add(1)
		go ix.watch(ctx, b.kv.Bucket(), w, &loading, b.apply)
	}
	done := make(chan struct{})
	go func() { loading.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("triggers: loading the index: %w", ctx.Err())
	}
	// Wake waiters when the watches end, so none waits forever.
	go func() {
		<-ctx.Done()
		ix.mu.Lock()
		ix.err = ctx.Err()
		ix.changed.Broadcast()
		ix.mu.Unlock()
	}()
	return ix, nil
}

// Wait returns once the watches have stopped.
func (ix *Index) Wait() { ix.wg.Wait() }

func (ix *Index) watch(ctx context.Context, bucket string, w jetstream.KeyWatcher, loading *sync.WaitGroup, apply func(string, []byte, bool)) {
	defer ix.wg.Done()
	defer func() { _ = w.Stop() }()
	loaded := false
	defer func() {
		if !loaded {
			loading.Done()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() == nil {
					// A stale index would accept revoked tokens: fail closed.
					ix.log.Error("watch closed; callbacks refused", "bucket", bucket)
					ix.mu.Lock()
					ix.err = errWatchClosed
					ix.changed.Broadcast()
					ix.mu.Unlock()
				}
				return
			}
			if e == nil {
				if !loaded {
					loaded = true
					loading.Done()
				}
				continue
			}
			ix.mu.Lock()
			apply(e.Key(), e.Value(), e.Operation() != jetstream.KeyValuePut)
			ix.seen[bucket] = max(ix.seen[bucket], e.Revision())
			ix.changed.Broadcast()
			ix.mu.Unlock()
		}
	}
}

// applyAgent folds an agents-bucket change in. Called with ix.mu held.
func (ix *Index) applyAgent(key string, value []byte, deleted bool) {
	var st subjects.AgentState
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
	var t subjects.Trigger
	if deleted || json.Unmarshal(value, &t) != nil {
		delete(ix.triggers, key)
		return
	}
	ix.triggers[key] = t
}

// waitSeen blocks until the index has applied revision rev of bucket.
func (ix *Index) waitSeen(ctx context.Context, bucket string, rev uint64) error {
	stop := context.AfterFunc(ctx, func() {
		ix.mu.Lock()
		ix.changed.Broadcast()
		ix.mu.Unlock()
	})
	defer stop()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for ix.seen[bucket] < rev {
		if ix.err != nil {
			return fmt.Errorf("triggers: index: %w", ix.err)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("triggers: index behind: %w", err)
		}
		ix.changed.Wait()
	}
	return nil
}

// resolve checks a token hash against the index, as Store.Resolve does.
func (ix *Index) resolve(hash string, mode subjects.DeliveryMode) (*subjects.Trigger, bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ref, ok := ix.tokens[hash]
	if !ok || ix.err != nil {
		return nil, false
	}
	t, ok := ix.triggers[recKey(ref.AgentID, ref.TriggerID)]
	if !ok || !usable(&t, hash, mode) || ix.agents[t.AgentID] != subjects.AgentActive {
		return nil, false
	}
	return &t, true
}

// active lists the agent's active triggers.
func (ix *Index) active(agentID string) []subjects.Trigger {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var out []subjects.Trigger
	for _, t := range ix.triggers {
		if t.AgentID == agentID && t.Status == subjects.TriggerActive {
			out = append(out, t)
		}
	}
	return out
}
