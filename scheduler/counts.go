package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/pacer"
)

// In the sharded layout no replica sees every shard's records, so the
// create quotas cannot count an agent's records in memory as the
// unsharded layout does (presence). Instead the owner of each shard
// writes, per agent with records there, how many are active, under
// <agent>.<shard> in the counts bucket; a create sums the agent's keys
// over every shard with one batched direct get (Counts).
//
// The counts are derived from the records, so they heal themselves: a
// shard's new owner, once it has loaded the shard, writes what it holds
// and removes the keys of agents it holds none of. They lag the records
// by a watch delivery and a flush (countFlushEvery): creates racing for
// an agent's last places may overshoot by what lands within that, as
// concurrent creates may anyway.

// count is one agent's active records in one shard.
type count struct {
	Timers int `json:"timers,omitempty"`
	Waits  int `json:"waits,omitempty"`
}

// countKey names one agent's count in one shard.
type countKey struct {
	shard int
	agent string
}

// String is the key's name, <agent>.<shard>: the agent first, so a
// create's read of its keys is a literal prefix, which the server finds
// at once (a leading wildcard makes it match every key; measured 10x
// slower, and it bounded creates to about 1,500/s).
func (k countKey) String() string { return k.agent + "." + strconv.Itoa(k.shard) }

// countFlushEvery is how often the changed counts are written: a burst
// of one agent's creates in one shard costs one write per flush, not one
// per create.
const countFlushEvery = 20 * time.Millisecond

// countWriter writes the changed counts of the shards this replica holds.
type countWriter struct {
	kv  jetstream.KeyValue
	log *slog.Logger

	mu    sync.Mutex
	dirty map[countKey]struct{}
	// reconcile are loaded shards whose stored keys are still to be
	// checked against what this replica holds.
	reconcile map[int]struct{}
	kick      chan struct{}
	failLog   *pacer.Pacer
	inflight  int // taken by the flush under way
}

// pending is how many counts are changed and not yet written.
func (w *countWriter) pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.dirty) + w.inflight
}

func newCountWriter(kv jetstream.KeyValue, log *slog.Logger) *countWriter {
	return &countWriter{
		kv: kv, log: log.With("component", "counts"), dirty: map[countKey]struct{}{}, reconcile: map[int]struct{}{},
		kick: make(chan struct{}, 1), failLog: pacer.New(10 * time.Second),
	}
}

// mark notes that the agent's count in shard changed.
func (w *countWriter) mark(shard int, agent string) {
	w.mu.Lock()
	w.dirty[countKey{shard, agent}] = struct{}{}
	w.mu.Unlock()
}

// loaded asks for shard's stored counts to be brought in line with what
// this replica now holds of it.
func (w *countWriter) loaded(shard int) {
	w.mu.Lock()
	w.reconcile[shard] = struct{}{}
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// run flushes until ctx ends, one flush at a time: a key's writes land in
// the order they were made.
func (w *countWriter) run(ctx context.Context, s *Scheduler) {
	tick := time.NewTicker(countFlushEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-w.kick:
		}
		if err := w.flush(ctx, s); err != nil && ctx.Err() == nil {
			w.failLog.Do(1, func(n int64) {
				w.log.Warn("counts not written; they are retried", "err", err, "failures", n)
			})
		}
	}
}

// flush writes every changed count of a shard this replica holds, loaded.
// What fails is marked again, to be retried.
func (w *countWriter) flush(ctx context.Context, s *Scheduler) error {
	w.mu.Lock()
	dirty, reconcile := w.dirty, w.reconcile
	w.dirty, w.reconcile = map[countKey]struct{}{}, map[int]struct{}{}
	w.inflight = len(dirty)
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.inflight = 0
		w.mu.Unlock()
	}()
	var errs []error
	for shard := range reconcile {
		if err := w.reconcileShard(ctx, s, shard, dirty); err != nil {
			errs = append(errs, err)
			w.loaded(shard)
		}
	}
	if len(dirty) == 0 {
		return errors.Join(errs...)
	}
	writes := make(map[countKey]count, len(dirty))
	s.mu.Lock()
	for k := range dirty {
		if s.shardStates[k.shard].bits.Load() == shardHeld {
			writes[k] = s.index.countOf(k.shard, k.agent)
		}
	}
	s.mu.Unlock()
	if err := w.write(ctx, writes); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// reconcileShard adds to dirty every agent this replica holds records of
// in shard, and purges the stored keys of agents it holds none of.
func (w *countWriter) reconcileShard(ctx context.Context, s *Scheduler, shard int, dirty map[countKey]struct{}) error {
	lister, err := w.kv.ListKeysFiltered(ctx, "*."+strconv.Itoa(shard))
	if err != nil {
		return fmt.Errorf("counts: list shard %d: %w", shard, err)
	}
	var stored []string
	for key := range lister.Keys() {
		stored = append(stored, key)
	}
	s.mu.Lock()
	if s.shardStates[shard].bits.Load() != shardHeld {
		s.mu.Unlock()
		return nil // lost meanwhile: its new owner reconciles
	}
	held := s.index.agentsIn(shard)
	s.mu.Unlock()
	for _, agent := range held {
		dirty[countKey{shard, agent}] = struct{}{}
	}
	for _, key := range stored {
		agent, _, _ := strings.Cut(key, ".")
		dirty[countKey{shard, agent}] = struct{}{} // zero unless held: purged
	}
	return nil
}

// countWriters bound the writes in flight at once.
const countWriters = 16

// write stores each count, purging the zero ones (their markers expire).
func (w *countWriter) write(ctx context.Context, writes map[countKey]count) error {
	type job struct {
		key countKey
		c   count
	}
	jobs := make(chan job)
	var (
		mu     sync.Mutex
		failed []error
		wg     sync.WaitGroup
	)
	for range min(countWriters, len(writes)) {
		wg.Go(func() {
			for j := range jobs {
				err := w.writeOne(ctx, j.key, j.c)
				if err != nil {
					mu.Lock()
					failed = append(failed, err)
					mu.Unlock()
					w.mark(j.key.shard, j.key.agent)
				}
			}
		})
	}
	for k, c := range writes {
		jobs <- job{k, c}
	}
	close(jobs)
	wg.Wait()
	if len(failed) > 0 {
		return fmt.Errorf("counts: %d of %d writes failed: %w", len(failed), len(writes), failed[0])
	}
	return nil
}

func (w *countWriter) writeOne(ctx context.Context, k countKey, c count) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if c == (count{}) {
		err := w.kv.Purge(ctx, k.String(), jetstream.PurgeTTL(time.Minute))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		return err
	}
	b, _ := json.Marshal(c)
	_, err := w.kv.Put(ctx, k.String(), b)
	return err
}

// Counts reads the counts the shards' owners write, for the create quotas
// in the sharded layout: a quotas.Counter. An agent's read returns a key
// per shard it has records in (up to CHIME_SHARDS messages, about a
// millisecond), so a sum is reused for countFresh, and creates admitted
// on this replica meanwhile are added to it (Admitted): an agent's burst
// on one replica is counted exactly, and what others admit shows within
// countFresh plus the owners' flush.
type Counts struct {
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	now func() time.Time

	mu     sync.Mutex
	recent map[string]*cachedCount
}

// cachedCount is an agent's sum as read, plus what was admitted since.
type cachedCount struct {
	count
	read time.Time
}

// countFresh is how long a read sum is reused; countCached bounds the
// agents whose sums are kept (the map starts over beyond it).
const (
	countFresh  = 100 * time.Millisecond
	countCached = 1 << 16
)

// NewCounts reads the counts in kv; now is the clock of the reuse.
func NewCounts(js jetstream.JetStream, kv jetstream.KeyValue, now func() time.Time) *Counts {
	if now == nil {
		now = time.Now
	}
	return &Counts{js: js, kv: kv, now: now, recent: map[string]*cachedCount{}}
}

// ActiveTimers is the agent's active timers over every shard.
func (c *Counts) ActiveTimers(ctx context.Context, agentID string) (int, error) {
	n, err := c.sum(ctx, agentID)
	return n.Timers, err
}

// ActiveWaits is the agent's waiting waits over every shard.
func (c *Counts) ActiveWaits(ctx context.Context, agentID string) (int, error) {
	n, err := c.sum(ctx, agentID)
	return n.Waits, err
}

// Admitted counts a create the quotas let through on this replica into
// the agent's reused sum, until the next read has it.
func (c *Counts) Admitted(agentID string, wait bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.recent[agentID]; e != nil {
		if wait {
			e.Waits++
		} else {
			e.Timers++
		}
	}
}

// sum is the agent's count over every shard: reused, or read.
func (c *Counts) sum(ctx context.Context, agentID string) (count, error) {
	now := c.now()
	c.mu.Lock()
	if e := c.recent[agentID]; e != nil && now.Sub(e.read) < countFresh {
		n := e.count
		c.mu.Unlock()
		return n, nil
	}
	c.mu.Unlock()
	n, err := c.read(ctx, agentID)
	if err != nil {
		return count{}, err
	}
	c.mu.Lock()
	if len(c.recent) >= countCached {
		clear(c.recent)
	}
	c.recent[agentID] = &cachedCount{count: n, read: now}
	c.mu.Unlock()
	return n, nil
}

// read sums the agent's key in every shard with one request.
func (c *Counts) read(ctx context.Context, agentID string) (count, error) {
	keys, err := kvrec.Values(ctx, c.js, c.kv.Bucket(), agentID+".*")
	if err != nil {
		return count{}, fmt.Errorf("counts: %w", err)
	}
	var total count
	for key, data := range keys {
		var n count
		if err := json.Unmarshal(data, &n); err != nil {
			return count{}, fmt.Errorf("counts: %s: %w", key, err)
		}
		total.Timers += n.Timers
		total.Waits += n.Waits
	}
	return total, nil
}
