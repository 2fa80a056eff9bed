package waitfor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/kvwatch"
)

// Index is a replica's in-memory view of the scope index (the idx.*
// entries of the WaitFor bucket), kept by a KV watch, so that matching an
// envelope costs no storage read.
//
// A view may lag: a registration's entry can be written, and a wake for
// it stored in the inbox, before this replica's watch has applied the
// entry. The registration's own catch-up covers only the envelopes stored
// before it read the inbox's end, so the consumer must not trust the view
// alone. Fresh orders the two soundly: it reads the index's last revision
// from the bucket stream's leader after the envelope was received, and
// waits until the view has applied it. Every entry written before the
// envelope was stored is then in the view, and one read serves all the
// envelopes received before it began (see fresh).
type Index struct {
	watch  *kvwatch.Watch
	js     jetstream.JetStream
	bucket string
	log    *slog.Logger

	// direct is set when the bucket has one replica: a direct get, which
	// a server answers at once (the stream's message API goes through the
	// JetStream API queue: measured, a third slower under load), is then
	// answered by the leader, the only server holding it. With replicas a
	// follower may answer a direct get and lag, so the leader is asked.
	// The replica count is read at start: chime changes it only through
	// its configuration, at a restart.
	direct jetstream.Stream

	// lag delays each change the view applies (tests: a replica whose
	// watch lags).
	lag time.Duration

	mu     sync.Mutex
	agents map[string]map[string]scope // agent -> work item ("": the agent scope)
	// freshAt is when the last catch-up that succeeded began (monotonic):
	// the view then held every entry written before it. Zero after a
	// reset, until one that began after it succeeds; gen counts resets.
	freshAt time.Time
	gen     uint64

	fresh freshness

	ctx    context.Context // the index's life, from Start: cancelled by Stop
	cancel context.CancelFunc
	once   sync.Once
}

// freshTimeout bounds one Fresh: a view that cannot catch up in this time
// (its watch lost) fails the envelope, which is redelivered.
const freshTimeout = 5 * time.Second

// presenceWindow is how long a catch-up vouches for the view's absence of
// an agent. An envelope of an agent the view has no entry for is passed
// over with no read when a catch-up that began less than presenceWindow
// before succeeded (see Absent), and a registration waits presenceWindow
// after writing its entry before it catches up on the envelopes stored
// since it was made (see Service.activated): an envelope stored after
// that catch-up read is then received at least presenceWindow after the
// entry was written, so a catch-up recent enough to vouch began after the
// entry was written and the view holds it. Both sides measure real
// (monotonic) time, on their own machines: durations, not instants, so
// the clocks need not agree. A view that lags by more than the window
// never vouches (its catch-ups end too late), and is read as before.
const presenceWindow = 10 * time.Millisecond

// NewIndex returns the view of the bucket's index; Start loads it.
func NewIndex(js jetstream.JetStream, bucket string, log *slog.Logger) *Index {
	return newIndex(js, bucket, log, 0)
}

// newIndex is NewIndex with a view that applies each change lag late.
func newIndex(js jetstream.JetStream, bucket string, log *slog.Logger, lag time.Duration) *Index {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ix := &Index{js: js, bucket: bucket, log: log.With("component", "waitfor"), agents: map[string]map[string]scope{}, lag: lag}
	ix.fresh.catchUp = ix.catchUp
	ix.watch = kvwatch.New(kvwatch.Config{JS: js, Bucket: bucket, Keys: idxKeys, Apply: ix.apply, Reset: ix.reset, Log: log})
	return ix
}

// Start watches the bucket's index and returns once its current entries
// are loaded; ctx bounds only that. The watch runs until Stop.
func (ix *Index) Start(ctx context.Context) error {
	st, err := ix.js.Stream(ctx, "KV_"+ix.bucket)
	if err != nil {
		return fmt.Errorf("waitfor: index: %w", err)
	}
	if st.CachedInfo().Config.Replicas <= 1 {
		ix.direct = st
	}
	ix.ctx, ix.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := ix.watch.Start(ix.ctx); err != nil {
		_ = ix.Stop(ctx)
		return fmt.Errorf("waitfor: index: %w", err)
	}
	select {
	case <-ix.watch.Loaded():
		return nil
	case <-ctx.Done():
		_ = ix.Stop(ctx)
		return fmt.Errorf("waitfor: loading the index: %w", ctx.Err())
	}
}

// Stop ends the watch. Idempotent and safe without Start.
func (ix *Index) Stop(ctx context.Context) error {
	ix.once.Do(func() {
		if ix.cancel != nil {
			ix.cancel()
		}
		_ = ix.watch.Stop(ctx)
		ix.fresh.stop()
	})
	return nil
}

// Live reports whether the view is kept current, and if not, why.
func (ix *Index) Live() (bool, string) { return ix.watch.Live() }

func (ix *Index) reset() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.agents = map[string]map[string]scope{}
	// Reloading, the view vouches for nothing until a catch-up that
	// began after the reset succeeds.
	ix.freshAt = time.Time{}
	ix.gen++
}

// apply folds one index change in: idx.<agent>.agent or
// idx.<agent>.item.<work item>.
func (ix *Index) apply(e kvwatch.Entry) {
	parts := strings.SplitN(e.Key, ".", 4)
	if len(parts) < 3 {
		return
	}
	agentID, item := parts[1], ""
	if len(parts) == 4 {
		item = parts[3]
	}
	if ix.lag > 0 {
		time.Sleep(ix.lag)
	}
	var sc scope
	live := !e.Deleted && json.Unmarshal(e.Value, &sc) == nil && sc.WaitID != ""
	ix.mu.Lock()
	defer ix.mu.Unlock()
	scopes := ix.agents[agentID]
	if !live {
		delete(scopes, item)
		if len(scopes) == 0 {
			delete(ix.agents, agentID)
		}
		return
	}
	if scopes == nil {
		scopes = map[string]scope{}
		ix.agents[agentID] = scopes
	}
	sc.rev = e.Revision
	scopes[item] = sc
}

// entries returns a copy of the agent's entries as the view holds them.
func (ix *Index) entries(agentID string) []scope {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	out := make([]scope, 0, len(ix.agents[agentID]))
	for _, sc := range ix.agents[agentID] {
		out = append(out, sc)
	}
	return out
}

// ActiveWaitFors is how many live registrations the agent has: one a
// scope at most, as the view holds them (for the per-agent limit,
// quotas.WaitForCounter).
func (ix *Index) ActiveWaitFors(agentID string) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return len(ix.agents[agentID])
}

// HasWaitFor reports a live registration in the agent's scope of
// workItemID ("": the agent scope), which a new one there replaces.
func (ix *Index) HasWaitFor(agentID, workItemID string) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	_, ok := ix.agents[agentID][workItemID]
	return ok
}

// Absent reports whether the agent has no registration an envelope
// received before the call can concern, known without a read: the view
// has no entry of the agent, and a catch-up that began less than
// presenceWindow ago succeeded (why that suffices: presenceWindow). When
// the last one is older than half the window, another begins, so that
// under a steady flow of envelopes the view keeps vouching.
func (ix *Index) Absent(agentID string) bool {
	ix.mu.Lock()
	vouched := !ix.freshAt.IsZero()
	age := time.Since(ix.freshAt)
	absent := vouched && age < presenceWindow && len(ix.agents[agentID]) == 0
	ix.mu.Unlock()
	if !vouched || age >= presenceWindow/2 {
		ix.fresh.kick()
	}
	return absent
}

// Fresh returns once the view holds every index entry written before it
// was called.
func (ix *Index) Fresh(ctx context.Context) error {
	return ix.fresh.join(ctx)
}

// catchUp reads the index's last revision from the leader and waits for
// the view to apply it.
func (ix *Index) catchUp() error {
	ix.mu.Lock()
	began, gen := time.Now(), ix.gen
	ix.mu.Unlock()
	ctx, cancel := context.WithTimeout(ix.ctx, freshTimeout)
	defer cancel()
	last, err := ix.last(ctx)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		// no entry was ever written, or all are gone
	case err != nil:
		return fmt.Errorf("waitfor: index: %w", err)
	default:
		// An entry removed before the watch got to it (an expired purge
		// marker) is passed by the next write; until then this times out
		// and the envelope is redelivered, never matched against a stale
		// view.
		if err := ix.watch.WaitSeen(ctx, last); err != nil {
			return fmt.Errorf("waitfor: index: %w", err)
		}
	}
	ix.mu.Lock()
	if ix.gen == gen && began.After(ix.freshAt) {
		ix.freshAt = began
	}
	ix.mu.Unlock()
	return nil
}

// last reads the index's last revision as the leader has it.
func (ix *Index) last(ctx context.Context) (uint64, error) {
	if ix.direct == nil {
		last, err := kvrec.LeaderLast(ctx, ix.js.Conn(), ix.bucket, idxKeys)
		if err != nil {
			return 0, err
		}
		return last.Seq, nil
	}
	m, err := ix.direct.GetLastMsgForSubject(ctx, "$KV."+ix.bucket+"."+idxKeys)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, jetstream.ErrKeyNotFound
	}
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}

// freshness runs catch-ups for its callers, each serving every caller that
// joined before it began, so none is served by a read that began before
// it arrived. Up to freshRounds run at once, each begun as soon as it is
// wanted; beyond that, callers share the one waiting for a free slot: under
// load one leader read serves a batch of envelopes.
type freshness struct {
	catchUp func() error

	mu      sync.Mutex
	pending *round // not begun: waits for a slot
	running int
	stopped bool
	idle    sync.WaitGroup
}

// freshRounds bounds the catch-ups running at once.
const freshRounds = 4

type round struct {
	done chan struct{}
	err  error
}

func (f *freshness) join(ctx context.Context) error {
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return kvwatch.ErrStopped
	}
	r := f.pending
	if r == nil {
		r = &round{done: make(chan struct{})}
		if f.running < freshRounds {
			f.running++
			f.idle.Add(1)
			go f.run(r)
		} else {
			f.pending = r
		}
	}
	f.mu.Unlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// kick begins a round unless one is running or waiting: a caller that
// wants the view fresh soon but does not wait for it.
func (f *freshness) kick() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped || f.running > 0 || f.pending != nil {
		return
	}
	f.running++
	f.idle.Add(1)
	go f.run(&round{done: make(chan struct{})})
}

// run runs r, then the pending round while there is one.
func (f *freshness) run(r *round) {
	defer f.idle.Done()
	for r != nil {
		r.err = f.catchUp()
		close(r.done)
		f.mu.Lock()
		r, f.pending = f.pending, nil
		if r == nil {
			f.running--
		}
		f.mu.Unlock()
	}
}

// stop refuses new callers and waits for the rounds running.
func (f *freshness) stop() {
	f.mu.Lock()
	f.stopped = true
	f.mu.Unlock()
	f.idle.Wait()
}
