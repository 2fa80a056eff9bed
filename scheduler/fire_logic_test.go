package scheduler

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/chime-nats/chime/internal/kvwatch"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

// clock is a settable fake clock for the pure logic of firing.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock               { return &clock{t: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)} }
func at(ns int64) time.Time          { return time.Unix(0, ns).UTC() }
func ms(n int) time.Duration         { return time.Duration(n) * time.Millisecond }
func allOwned(n int) []bool {
	o := make([]bool, n)
	for i := range o {
		o[i] = true
	}
	return o
}
func (s *Scheduler) entry(key string) *entry { return s.index.entries[key] }

// newTestScheduler returns a scheduler that holds every shard, as a lone
// replica does once its leases are loaded.
func newTestScheduler(c *clock) *Scheduler {
	s := New(Config{Shards: 4, Now: c.now})
	for sh := range s.shardStates {
		s.shardStates[sh].bits.Store(shardHeld)
	}
	return s
}

func putTimer(t *testing.T, s *Scheduler, tm timers.Timer) {
	t.Helper()
	b, err := json.Marshal(tm)
	if err != nil {
		t.Fatal(err)
	}
	s.applyTimer("", 0, kvwatch.Entry{Key: subjects.TimerKey(tm.AgentID, tm.ID), Value: b})
}

func putWait(t *testing.T, s *Scheduler, w waits.Wait) {
	t.Helper()
	putWaitAt(t, s, w, 0)
}

// putWaitAt applies w as its record's revision rev.
func putWaitAt(t *testing.T, s *Scheduler, w waits.Wait, rev uint64) {
	t.Helper()
	b, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	s.applyWait("", 0, kvwatch.Entry{Key: w.Key(), Value: b, Revision: rev})
}

// pop fires what is due at the clock's time, as one pass of the loop does,
// and settles each timer fire as stored (its ack came).
func pop(s *Scheduler, c *clock) ([]timers.TimerFired, []waits.WaitFired) {
	tf, wf := popUnsettled(s, c)
	for _, f := range tf {
		s.settled(subjects.TimerKey(f.AgentID, f.TimerID), f.Occurrence, 0, 0)
	}
	return tf, wf
}

// popUnsettled is pop without the acks.
func popUnsettled(s *Scheduler, c *clock) ([]timers.TimerFired, []waits.WaitFired) {
	s.mu.Lock()
	defer s.mu.Unlock()
	batch := s.index.popDue(allOwned(s.cfg.Shards), c.now().UnixNano(), 1024, nil)
	return s.prepare(batch, c.now())
}

func TestFailedFireRetriesTheSameOccurrence(t *testing.T) {
	c := newClock()
	s := newTestScheduler(c)
	due := c.now().Add(time.Second)
	putTimer(t, s, timers.Timer{ID: "t1", AgentID: "a", Status: timers.TimerActive, NextFireAt: &due})

	c.add(time.Second)
	fires, _ := pop(s, c)
	if len(fires) != 1 || fires[0].Occurrence != 1 || !fires[0].DueAt.Equal(due) {
		t.Fatalf("fires %+v", fires)
	}
	c.add(ms(20))
	s.rearm(pendingFire{key: "a.t1", occ: 1, due: due.UnixNano()}, errors.New("stream unavailable"))
	en := s.entry("a.t1")
	if en.occ != 1 || en.due != due.UnixNano() || en.fired != 0 {
		t.Fatalf("re-armed as occ %d due %v fired %d", en.occ, at(en.due), en.fired)
	}
	if back := at(en.at).Sub(c.now()); back < ms(50) || back > ms(100) {
		t.Fatalf("first retry after %v, want 50-100ms", back)
	}
	if f, _ := pop(s, c); len(f) != 0 {
		t.Fatal("retried before its backoff")
	}
	c.t = at(en.at)
	fires, _ = pop(s, c)
	if len(fires) != 1 || fires[0].Occurrence != 1 || !fires[0].DueAt.Equal(due) || fires[0].EnvelopeID() != "timer_t1_1" {
		t.Fatalf("retry %+v: must be the same occurrence, due and ID", fires)
	}
	// The backoff grows and stays bounded.
	for i := range 12 {
		s.rearm(pendingFire{key: "a.t1", occ: 1, due: due.UnixNano()}, errors.New("again"))
		if back := at(en.at).Sub(c.now()); back > 5*time.Second {
			t.Fatalf("retry %d after %v", i, back)
		}
		s.mu.Lock()
		s.index.disarm(en)
		en.fired = 1
		s.mu.Unlock()
	}
}

func TestRepeatingKeepsCadenceThroughRetries(t *testing.T) {
	c := newClock()
	s := newTestScheduler(c)
	first := c.now().Add(time.Second)
	iv := int64(1000)
	putTimer(t, s, timers.Timer{ID: "r", AgentID: "a", Status: timers.TimerActive, NextFireAt: &first, IntervalMs: &iv, Repeat: true})

	c.t = first
	fires, _ := pop(s, c)
	if len(fires) != 1 || fires[0].NextDue == nil || !fires[0].NextDue.Equal(first.Add(time.Second)) {
		t.Fatalf("occurrence 1: %+v", fires)
	}
	// Occurrence 1's publish fails after 2 is already armed: 1 comes back
	// with its own due time and the next due time its first attempt
	// stated (that attempt may be stored: a lost ack), however late the
	// retry; 2 follows at once, the catch-up fire of what fell due.
	s.rearm(pendingFire{key: "a.r", occ: 1, due: first.UnixNano(), timer: fires[0]}, errors.New("no ack"))
	c.add(1500 * time.Millisecond)
	fires, _ = pop(s, c)
	if len(fires) != 1 || fires[0].Occurrence != 1 || !fires[0].DueAt.Equal(first) {
		t.Fatalf("retry: %+v", fires)
	}
	if !fires[0].NextDue.Equal(first.Add(time.Second)) {
		t.Fatalf("next due after a late retry: %v, want the first attempt's %v", fires[0].NextDue, first.Add(time.Second))
	}
	fires, _ = pop(s, c)
	if len(fires) != 1 || fires[0].Occurrence != 2 || !fires[0].DueAt.Equal(first.Add(time.Second)) || !fires[0].NextDue.Equal(first.Add(2*time.Second)) {
		t.Fatalf("occurrence 2: %+v", fires)
	}
	// A retry without its first attempt (an older caller) numbers from
	// the clock, as before.
	s.rearm(pendingFire{key: "a.r", occ: 2, due: first.Add(time.Second).UnixNano()}, errors.New("no ack"))
	c.add(time.Second)
	fires, _ = pop(s, c)
	if len(fires) != 1 || fires[0].Occurrence != 2 || !fires[0].NextDue.Equal(first.Add(3*time.Second)) {
		t.Fatalf("retry of 2: %+v", fires)
	}
}

// TestOverdueRepeatingFiresOnceAtTakeover: a shard taken over long after a
// repeating timer's due time fires the overdue occurrence once, at once,
// and the record is told the next point of the original cadence.
func TestOverdueRepeatingFiresOnceAtTakeover(t *testing.T) {
	c := newClock()
	s := newTestScheduler(c)
	due := c.now()
	iv := int64(1000)
	putTimer(t, s, timers.Timer{ID: "r", AgentID: "a", Status: timers.TimerActive, NextFireAt: &due, IntervalMs: &iv, Repeat: true, FireCount: 4})
	c.add(ms(3500))
	fires, _ := pop(s, c)
	if len(fires) != 1 || fires[0].Occurrence != 5 || !fires[0].DueAt.Equal(due) {
		t.Fatalf("overdue: %+v", fires)
	}
	if want := due.Add(4 * time.Second); !fires[0].NextDue.Equal(want) {
		t.Fatalf("next due %v, want %v", fires[0].NextDue, want)
	}
	if f, _ := pop(s, c); len(f) != 0 {
		t.Fatalf("caught up with %d more", len(f))
	}
}

// TestRecordEchoDoesNotUndoProgress: the record update of occurrence n
// arrives while n+1 is armed or backing off: the index keeps its place.
func TestRecordEchoDoesNotUndoProgress(t *testing.T) {
	c := newClock()
	s := newTestScheduler(c)
	first := c.now()
	iv := int64(1000)
	rec := timers.Timer{ID: "r", AgentID: "a", Status: timers.TimerActive, NextFireAt: &first, IntervalMs: &iv, Repeat: true}
	putTimer(t, s, rec)
	pop(s, c) // occurrence 1
	c.add(time.Second)
	pop(s, c) // occurrence 2
	s.rearm(pendingFire{key: "a.r", occ: 2, due: first.Add(time.Second).UnixNano()}, errors.New("x"))
	en := s.entry("a.r")
	retryAt := en.at
	// The record of occurrence 1 lands now.
	next := first.Add(time.Second)
	rec.FireCount, rec.NextFireAt = 1, &next
	putTimer(t, s, rec)
	if en.occ != 2 || en.at != retryAt || en.attempts != 1 {
		t.Fatalf("echo moved the entry: occ %d at %v attempts %d", en.occ, at(en.at), en.attempts)
	}
}

func TestWaitRetryKeepsItsTarget(t *testing.T) {
	c := newClock()
	s := newTestScheduler(c)
	target := c.now().Add(time.Second)
	w := waits.Wait{ID: "w1", AgentID: "a", Mode: waits.WaitDuration, Status: waits.WaitWaiting, TargetTime: target}
	putWaitAt(t, s, w, 7)
	c.t = target
	_, fired := pop(s, c)
	// The fire names the revision it was decided on: its completion
	// reads no older answer (kvrec.AtLeast).
	if len(fired) != 1 || !fired[0].Target.Equal(target) || fired[0].Rev != 7 {
		t.Fatalf("wait fire %+v", fired)
	}
	s.rearm(pendingFire{wait: true, key: w.Key(), occ: 1, due: target.UnixNano()}, errors.New("x"))
	c.add(time.Second)
	_, fired = pop(s, c)
	if len(fired) != 1 || !fired[0].Target.Equal(target) || fired[0].MsgID() != (&waits.WaitFired{AgentID: "a", WaitID: "w1", Target: target}).MsgID() {
		t.Fatalf("retried wait fire %+v: the target (and so the event ID) must not move", fired)
	}
	// A record that moved the target meanwhile wins over a late failure.
	moved := target.Add(time.Hour)
	w.TargetTime = moved
	putWait(t, s, w)
	s.rearm(pendingFire{wait: true, key: w.Key(), occ: 1, due: target.UnixNano()}, errors.New("late"))
	if en := s.index.waits[w.Key()]; en.due != moved.UnixNano() {
		t.Fatalf("late failure moved the wait back to %v", at(en.due))
	}
}

func TestHealthFollowsPublishes(t *testing.T) {
	c := newClock()
	h := health{now: c.now}
	for range failStreak - 1 {
		h.failure(errors.New("x"))
	}
	if ok, _ := h.ok(); !ok {
		t.Fatal("unhealthy before the streak")
	}
	h.failure(errors.New("stream offline"))
	if ok, why := h.ok(); ok || why == "" {
		t.Fatalf("healthy after %d failures", failStreak)
	}
	c.add(failQuiet + time.Millisecond)
	if ok, _ := h.ok(); !ok {
		t.Fatal("no recovery after a quiet spell")
	}
	h.failure(errors.New("x"))
	h.success()
	if ok, _ := h.ok(); !ok {
		t.Fatal("a success must end the streak")
	}
}

// TestNextOccurrenceAwaitsTheStoredOne: a repeating timer's next occurrence
// is not fired before the previous one's publish settles, and when the
// stored envelope (a duplicate's original) states another next due time,
// the cadence goes on from that one: at once, as the catch-up fire.
func TestNextOccurrenceAwaitsTheStoredOne(t *testing.T) {
	c := newClock()
	s := newTestScheduler(c)
	first := c.now()
	iv := int64(1000)
	putTimer(t, s, timers.Timer{ID: "r", AgentID: "a", Status: timers.TimerActive, NextFireAt: &first, IntervalMs: &iv, Repeat: true})
	c.add(2500 * time.Millisecond) // a takeover, late
	fires, _ := popUnsettled(s, c)
	if len(fires) != 1 || fires[0].Occurrence != 1 || !fires[0].NextDue.Equal(first.Add(3*time.Second)) {
		t.Fatalf("occurrence 1: %+v", fires)
	}
	c.add(time.Second)
	if f, _ := popUnsettled(s, c); len(f) != 0 {
		t.Fatalf("occurrence 2 fired before 1 settled: %+v", f)
	}
	// 1 was a duplicate: the stored one, fired on time, states first+1s.
	s.settled("a.r", 1, fires[0].NextDue.UnixNano(), first.Add(time.Second).UnixNano())
	fires, _ = pop(s, c)
	if len(fires) != 1 || fires[0].Occurrence != 2 || !fires[0].DueAt.Equal(first.Add(time.Second)) ||
		!fires[0].NextDue.Equal(first.Add(4*time.Second)) {
		t.Fatalf("occurrence 2: %+v", fires)
	}
	// A settle that comes after the record moved the entry changes nothing.
	s.settled("a.r", 1, 0, first.UnixNano())
	if en := s.entry("a.r"); en.occ != 3 || en.due != first.Add(4*time.Second).UnixNano() {
		t.Fatalf("late settle moved the entry: occ %d due %v", en.occ, at(en.due))
	}
}
