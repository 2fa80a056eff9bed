package scheduler

import (
	"strings"
	"testing"
	"time"

	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/timers"
)

// TestStallsSayWhy: a held shard's timer overdue past stallAfter is a
// stall, named with the first of the fire loop's conditions it fails;
// one less overdue, or in a shard not held, is not.
func TestStallsSayWhy(t *testing.T) {
	c := newClock()
	s := newTestScheduler(c)
	s.cfg.Leases = NewLeases(LeasesConfig{Shards: s.cfg.Shards, Now: c.now})
	due := c.now().Add(time.Second)
	putTimer(t, s, timers.Timer{ID: "t1", AgentID: "a", Status: timers.TimerActive, NextFireAt: &due})
	sh := partitions.ShardOf("a.t1", s.cfg.Shards)

	c.add(time.Second + stallAfter - time.Millisecond)
	if got := s.stalls(c.now()); len(got) != 0 {
		t.Fatalf("stalled before stallAfter: %v", got)
	}
	c.add(time.Millisecond)
	want := func(why string) {
		t.Helper()
		got := s.stalls(c.now())
		if len(got) != 1 || got[0].shard != sh || got[0].overdue != stallAfter || !strings.Contains(got[0].why, why) {
			t.Fatalf("stalls %v, want shard %d %s overdue: %s", got, sh, stallAfter, why)
		}
	}
	want("lease is not confirmed")

	s.cfg.Leases.owned[sh] = lease{validUntil: c.now().Add(time.Hour)}
	want("fire loop has not reached it")

	s.mu.Lock()
	s.shardStates[sh].bits.Store(shardHeld | shardLoading)
	s.shardStates[sh].gainedAt = c.now().Add(-25 * time.Second)
	s.mu.Unlock()
	want("loading for 25s")

	s.mu.Lock()
	s.shardStates[sh].bits.Store(0) // given away: another replica's to fire
	s.mu.Unlock()
	if got := s.stalls(c.now()); len(got) != 0 {
		t.Fatalf("a shard not held stalled: %v", got)
	}
}
