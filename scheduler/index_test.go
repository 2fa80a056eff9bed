package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chime-nats/chime/internal/kvwatch"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

func TestIndexFiresOnlyOwnedShardsInDueOrder(t *testing.T) {
	ix := newIndex(4)
	for i := range 40 {
		key := fmt.Sprintf("agent.t%d", i)
		e := &entry{key: key, agentLen: len("agent"), due: int64(100 - i), at: int64(100 - i), occ: 1, shard: partitions.ShardOf(key, 4), pos: -1}
		ix.entries[key] = e
		ix.arm(e)
	}
	owned := []bool{true, false, true, false}
	next, ok := ix.next(owned)
	if !ok {
		t.Fatal("nothing armed in owned shards")
	}
	got := ix.popDue(owned, 80, 1000, nil)
	for _, e := range got {
		if !owned[e.shard] || e.due > 80 {
			t.Fatalf("popped %s (shard %d, due %d)", e.key, e.shard, e.due)
		}
		if e.due < next {
			t.Fatalf("next %d is after popped due %d", next, e.due)
		}
		if e.agentID() != "agent" || e.itemID() == "" {
			t.Fatalf("key split: %q %q", e.agentID(), e.itemID())
		}
	}
	// Everything due and owned was popped; unowned shards kept theirs.
	for s, h := range ix.shards {
		for _, e := range h {
			if owned[s] && e.due <= 80 {
				t.Fatalf("left due entry %s in owned shard %d", e.key, s)
			}
		}
	}
	if n := len(ix.popDue(owned, 80, 1000, nil)); n != 0 {
		t.Fatalf("second pop found %d", n)
	}
	limited := ix.popDue([]bool{true, true, true, true}, 1000, 3, nil)
	if len(limited) != 3 {
		t.Fatalf("max ignored: %d", len(limited))
	}
	ix.remove(false, limited[0].key)
	if _, ok := ix.entries[limited[0].key]; ok {
		t.Fatal("remove kept the entry")
	}
}

// TestPerAgentCounts: the quotas' counts follow the index through creates,
// endings, deletes and reloads, per agent and per kind.
func TestPerAgentCounts(t *testing.T) {
	c := newClock()
	s := newTestScheduler(c)
	due := c.now().Add(time.Hour)
	for i := range 3 {
		putTimer(t, s, timers.Timer{ID: fmt.Sprintf("t%d", i), AgentID: "a", Status: timers.TimerActive, NextFireAt: &due})
	}
	putTimer(t, s, timers.Timer{ID: "t0", AgentID: "b", Status: timers.TimerActive, NextFireAt: &due})
	putTimer(t, s, timers.Timer{ID: "t1", AgentID: "a", Status: timers.TimerActive, NextFireAt: &due}) // an update, not one more
	putWait(t, s, waits.Wait{ID: "w0", AgentID: "a", Status: waits.WaitWaiting, Mode: waits.WaitDuration, TargetTime: due})
	paused := c.now()
	putWait(t, s, waits.Wait{ID: "w1", AgentID: "a", Status: waits.WaitWaiting, Mode: waits.WaitDuration, TargetTime: due, PausedAt: &paused})
	if a, b, w := active(s.ActiveTimers, "a"), active(s.ActiveTimers, "b"), active(s.ActiveWaits, "a"); a != 3 || b != 1 || w != 2 {
		t.Fatalf("timers a=%d b=%d, waits a=%d; want 3 1 2", a, b, w)
	}
	putTimer(t, s, timers.Timer{ID: "t0", AgentID: "a", Status: timers.TimerCancelled})
	s.applyTimer("", 0, kvwatch.Entry{Key: subjects.TimerKey("a", "t1"), Deleted: true})
	putWait(t, s, waits.Wait{ID: "w0", AgentID: "a", Status: waits.WaitCompleted, TargetTime: due})
	if a, w := active(s.ActiveTimers, "a"), active(s.ActiveWaits, "a"); a != 1 || w != 1 {
		t.Fatalf("after endings: timers %d, waits %d; want 1 1", a, w)
	}
	s.reset(false)
	if a, b, w := active(s.ActiveTimers, "a"), active(s.ActiveTimers, "b"), active(s.ActiveWaits, "a"); a != 0 || b != 0 || w != 1 {
		t.Fatalf("after reloading timers: %d %d, waits %d", a, b, w)
	}
	if n := len(s.timers.n); n != 0 {
		t.Fatalf("%d agents without timers still counted", n)
	}
}

// active is a count of the scheduler's presence, which never fails.
func active(count func(context.Context, string) (int, error), agent string) int {
	n, _ := count(context.Background(), agent)
	return n
}

// A table fallen to a quarter of its peak is remade at its size, keeping
// every entry: a burst of timers, once fired, does not hold its room.
func TestIndexRemakesTablesAfterABurst(t *testing.T) {
	ix := newIndex(4)
	p := newPresence()
	const burst, kept = 4 * shrinkMin, 10
	for i := range burst {
		key := fmt.Sprintf("agent%d.t%d", i%7, i)
		e := &entry{key: key, agentLen: len(fmt.Sprint("agent", i%7)), due: int64(i), at: int64(i), occ: 1, shard: partitions.ShardOf(key, 4), pos: -1}
		ix.insert(e)
		ix.arm(e)
		p.set(key, e.agentLen, true)
	}
	if ix.entriesPeak != burst || p.keysPeak != burst {
		t.Fatalf("peaks %d and %d, want %d", ix.entriesPeak, p.keysPeak, burst)
	}
	for i := kept; i < burst; i++ {
		key := fmt.Sprintf("agent%d.t%d", i%7, i)
		ix.remove(false, key)
		p.set(key, len(fmt.Sprint("agent", i%7)), false)
	}
	if ix.entriesPeak >= shrinkMin || p.keysPeak >= shrinkMin {
		t.Fatalf("tables not remade: peaks %d and %d for %d entries", ix.entriesPeak, p.keysPeak, kept)
	}
	if len(ix.entries) != kept || p.len() != kept {
		t.Fatalf("%d entries and %d present, want %d", len(ix.entries), p.len(), kept)
	}
	owned := []bool{true, true, true, true}
	got := ix.popDue(owned, burst, burst, nil)
	for _, e := range got {
		if ix.entries[e.key] != e {
			t.Fatalf("entry %s lost in the remade table", e.key)
		}
	}
	if len(got) != kept || p.get("agent0")+p.get("agent1")+p.get("agent2") == 0 {
		t.Fatalf("popped %d, want %d; counts %v", len(got), kept, p.n)
	}
}
