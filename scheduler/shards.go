package scheduler

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/chime-nats/chime/internal/kvwatch"
	"github.com/chime-nats/chime/partitions"
)

// What the scheduler keeps of a shard, a bit set in shardState.
const (
	// shardHeld: its lease is this replica's, and its entries are kept.
	shardHeld uint32 = 1 << iota
	// shardLoading: gained, its entries not yet all loaded; it must not
	// fire, since a record it does not know yet may be due first.
	shardLoading
)

// shardState is one shard's bits. Written with Scheduler.mu held, so that
// they agree with the index; read without it by the watches' Apply,
// which must not wait behind a firing batch to skip what it need not
// decode.
type shardState struct {
	bits     atomic.Uint32
	loadGen  uint64    // the replay whose completion loads it; with mu
	gainedAt time.Time // with mu
	// In the sharded layout, with mu: the shard's own watches, the
	// gain they were started for (a watch of an earlier gain, still
	// stopping, must not touch the index), and lost, closed when that
	// gain ends.
	gen     uint64
	watches []*kvwatch.Watch
	lost    chan struct{}
}

// Reshard brings the shards whose entries this replica keeps in line with
// the leases it holds: a lost shard's entries are dropped at once, and a
// gained shard's are loaded by a replay of the watches before it fires.
// Leases calls it (OnChange) whenever the set changes.
func (s *Scheduler) Reshard() {
	leased := make([]bool, s.cfg.Shards)
	s.cfg.Leases.Leased(leased)
	if s.layout.Sharded() {
		s.reshardWatches(leased)
		return
	}
	now := s.cfg.Now()
	s.mu.Lock()
	gained := false
	for sh, want := range leased {
		st := &s.shardStates[sh]
		held := st.bits.Load()&shardHeld != 0
		switch {
		case want && !held:
			if !gained && s.watching {
				s.loadGen++
			}
			gained = true
			st.loadGen, st.gainedAt = s.loadGen, now
			st.bits.Store(shardHeld | shardLoading)
		case !want && held:
			st.bits.Store(0)
			s.index.dropShard(sh)
		}
	}
	replay := gained && s.watching
	gen, watches := s.loadGen, s.watches
	s.mu.Unlock()
	if replay {
		var done []<-chan struct{}
		for _, w := range watches {
			done = append(done, w.Replay())
		}
		go s.loadedWhen(s.ctx, gen, done...)
	}
	s.Wake()
}

// loadedWhen marks the shards of replays up to gen loaded once every one
// of done is closed.
func (s *Scheduler) loadedWhen(ctx context.Context, gen uint64, done ...<-chan struct{}) {
	for _, d := range done {
		select {
		case <-d:
		case <-ctx.Done():
			return
		}
	}
	now := s.cfg.Now()
	s.mu.Lock()
	loaded := 0
	for sh := range s.shardStates {
		st := &s.shardStates[sh]
		if st.bits.Load() == shardHeld|shardLoading && st.loadGen <= gen {
			st.bits.Store(shardHeld)
			s.m.shardLoad.Observe(now.Sub(st.gainedAt).Seconds())
			loaded++
		}
	}
	s.mu.Unlock()
	if loaded > 0 {
		s.log.Debug("shards loaded", "shards", loaded)
		s.Wake()
	}
}

// fireable narrows owned (leases valid now) to the shards whose entries
// are loaded.
func (s *Scheduler) fireable(owned []bool) {
	for sh := range owned {
		owned[sh] = owned[sh] && s.shardStates[sh].bits.Load() == shardHeld
	}
}

// holds reports whether shard sh's entries are kept: exact with mu held,
// a hint without it (checked again under mu before an entry is made).
func (s *Scheduler) holds(sh int) bool { return s.shardStates[sh].bits.Load()&shardHeld != 0 }

// skip reports whether a watch entry need not be looked at: applied
// before (a replay repeats it) and of a shard not being loaded.
func (s *Scheduler) skip(again bool, sh int) bool {
	return again && s.shardStates[sh].bits.Load()&shardLoading == 0
}

// ShardsHeld is how many shards this replica keeps the entries of.
func (s *Scheduler) ShardsHeld() int {
	n := 0
	for sh := range s.shardStates {
		if s.shardStates[sh].bits.Load()&shardHeld != 0 {
			n++
		}
	}
	return n
}

// reshardWatches is Reshard in the sharded layout: a gained shard gets
// watches of its own keys, which load it; a lost one's are stopped.
func (s *Scheduler) reshardWatches(leased []bool) {
	now := s.cfg.Now()
	var stop []*kvwatch.Watch
	s.mu.Lock()
	for sh, want := range leased {
		st := &s.shardStates[sh]
		held := st.bits.Load()&shardHeld != 0
		switch {
		case want && !held:
			st.gen++
			st.gainedAt = now
			st.bits.Store(shardHeld | shardLoading)
			if s.watching {
				s.watchShard(sh)
			}
		case !want && held:
			st.gen++
			st.bits.Store(0)
			s.index.dropShard(sh)
			stop = append(stop, st.watches...)
			st.watches = nil
			if st.lost != nil {
				close(st.lost)
				st.lost = nil
			}
		}
	}
	s.checkReady()
	s.mu.Unlock()
	// Outside mu: a stopping watch may be applying an entry, which takes
	// it (and then finds its gain over).
	for _, w := range stop {
		w.Stop(context.Background())
	}
	s.Wake()
}

// startSharded begins the watches of the shards held by now; the others
// start as they are gained.
func (s *Scheduler) startSharded() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watching = true
	for sh := range s.shardStates {
		if s.shardStates[sh].bits.Load()&shardHeld != 0 {
			s.watchShard(sh)
		}
	}
	s.checkReady()
}

// watchShard starts the watches of shard sh's keys, for its current gain.
// Called with mu held; starting a watch does not block.
func (s *Scheduler) watchShard(sh int) {
	st := &s.shardStates[sh]
	gen, p := st.gen, s.layout.PartitionOf(sh)
	st.lost = make(chan struct{})
	timers := s.cfg.Timers.KVs[p].Bucket()
	st.watches = []*kvwatch.Watch{kvwatch.New(kvwatch.Config{
		JS: s.cfg.JS, Bucket: timers, Keys: partitions.ShardKeys(sh), Heartbeat: s.cfg.Heartbeat, Log: s.cfg.Log,
		Apply: func(e kvwatch.Entry) { s.applyTimer(timers, gen, e) }, Reset: func() { s.resetShard(sh, gen, false) },
	})}
	if s.cfg.Waits != nil {
		waits := s.cfg.Waits.KVs[p].Bucket()
		st.watches = append(st.watches, kvwatch.New(kvwatch.Config{
			JS: s.cfg.JS, Bucket: waits, Keys: partitions.ShardKeys(sh), Heartbeat: s.cfg.Heartbeat, Log: s.cfg.Log,
			Apply: func(e kvwatch.Entry) { s.applyWait(waits, gen, e) }, Reset: func() { s.resetShard(sh, gen, true) },
		}))
	}
	loaded := make([]<-chan struct{}, 0, len(st.watches))
	for _, w := range st.watches {
		_ = w.Start(s.ctx) // it does not block, and never fails
		loaded = append(loaded, w.Loaded())
	}
	go s.shardLoaded(sh, gen, st.lost, loaded)
}

// shardLoaded marks shard sh loaded once its watches of gain gen have
// their first pass in, unless that gain ends first.
func (s *Scheduler) shardLoaded(sh int, gen uint64, lost <-chan struct{}, loaded []<-chan struct{}) {
	for _, d := range loaded {
		select {
		case <-d:
		case <-lost:
			return
		case <-s.ctx.Done():
			return
		}
	}
	now := s.cfg.Now()
	s.mu.Lock()
	st := &s.shardStates[sh]
	if st.gen != gen || st.bits.Load() != shardHeld|shardLoading {
		s.mu.Unlock()
		return
	}
	st.bits.Store(shardHeld)
	s.m.shardLoad.Observe(now.Sub(st.gainedAt).Seconds())
	s.counts.loaded(sh)
	s.checkReady()
	s.mu.Unlock()
	s.Wake()
}

// resetShard forgets the shard's timers or waits of gain gen: their
// bucket is being reloaded.
func (s *Scheduler) resetShard(sh int, gen uint64, wait bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shardStates[sh].gen != gen {
		return
	}
	for key, e := range s.index.table(wait) {
		if e.shard == sh {
			s.index.remove(wait, key)
		}
	}
}

// checkReady closes ready, in the sharded layout, once no held shard is
// loading: the first time, the shards held at start are in. Called with
// mu held.
func (s *Scheduler) checkReady() {
	if s.readyClosed || !s.watching {
		return
	}
	for sh := range s.shardStates {
		if s.shardStates[sh].bits.Load()&shardLoading != 0 {
			return
		}
	}
	s.readyClosed = true
	close(s.ready)
	s.log.Info("index loaded", "shards", s.ShardsHeld(), "timers", len(s.index.entries), "waits", len(s.index.waits))
}

// wholeWatches are the whole-bucket watches of the unsharded layout:
// none until Start has made them (read under mu, as Start writes them
// while the leases may ask Healthy).
func (s *Scheduler) wholeWatches() []*kvwatch.Watch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.watches
}

// allWatches are every watch this replica runs.
func (s *Scheduler) allWatches() []*kvwatch.Watch {
	if !s.layout.Sharded() {
		return s.wholeWatches()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*kvwatch.Watch
	for sh := range s.shardStates {
		out = append(out, s.shardStates[sh].watches...)
	}
	return out
}

// liveOnly narrows owned to the shards whose watches are live: a stale
// view may still hold what was cancelled. In the unsharded layout the
// watches are everyone's, so one not live clears all. It reports whether
// every watch was live.
func (s *Scheduler) liveOnly(owned []bool) bool {
	if !s.layout.Sharded() {
		live, _ := kvwatch.AllLive(s.wholeWatches()...)
		if !live {
			clear(owned)
		}
		return live
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	all := true
	for sh, ok := range owned {
		if !ok {
			continue
		}
		if live, _ := kvwatch.AllLive(s.shardStates[sh].watches...); !live {
			owned[sh], all = false, false
		}
	}
	return all
}

// watchesLive reports whether the watches let this replica fire. In the
// unsharded layout both whole-bucket watches must be live. In the sharded
// one each shard's watches gate only that shard (liveOnly), and one of
// dozens re-creating its consumer, or a gained shard's not started yet,
// must not give every shard away (measured on a 3-node cluster: replicas
// went unhealthy in turn, giving and taking all shards, and fires were
// missed); the replica is unhealthy only when no loaded shard it holds
// can fire.
func (s *Scheduler) watchesLive() (bool, string) {
	if !s.layout.Sharded() {
		return kvwatch.AllLive(s.wholeWatches()...)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	loaded, why := 0, ""
	for sh := range s.shardStates {
		st := &s.shardStates[sh]
		if st.bits.Load() != shardHeld {
			continue
		}
		loaded++
		live, w := kvwatch.AllLive(st.watches...)
		if live {
			return true, ""
		}
		why = w
	}
	if loaded == 0 {
		return true, ""
	}
	return false, fmt.Sprintf("no watch of the %d loaded shards is live (%s)", loaded, why)
}
