package scheduler

import (
	"context"
	"sync/atomic"
	"time"
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
}

// Reshard brings the shards whose entries this replica keeps in line with
// the leases it holds: a lost shard's entries are dropped at once, and a
// gained shard's are loaded by a replay of the watches before it fires.
// Leases calls it (OnChange) whenever the set changes.
func (s *Scheduler) Reshard() {
	leased := make([]bool, s.cfg.Shards)
	s.cfg.Leases.Leased(leased)
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
	gen := s.loadGen
	s.mu.Unlock()
	if replay {
		var done []<-chan struct{}
		for _, w := range s.watches {
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
