package scheduler

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

// These tests run the fire loop and the lease arithmetic on synctest's
// fake clock: time passes only when every goroutine of the bubble waits,
// so a fire's time is exactly when the loop published it.

// firedAt is one fire handed to the publish function, and when.
type firedAt struct {
	at time.Time
	f  timers.TimerFired
}

// recorder is a publishFunc that keeps what it is given.
type recorder struct {
	mu    sync.Mutex
	fires []firedAt
}

func (r *recorder) publish(_ context.Context, timerFires []timers.TimerFired, _ []waits.WaitFired) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range timerFires {
		r.fires = append(r.fires, firedAt{at: time.Now(), f: f})
	}
}

func (r *recorder) got() []firedAt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.fires)
}

// runLoop runs the fire loop of a scheduler holding all 4 shards, by
// leases valid until validUntil, for d of fake time; before runs first,
// during runs halfway through. It returns the fires.
func runLoop(t *testing.T, validUntil time.Time, d time.Duration, before, during func(*Scheduler)) []firedAt {
	t.Helper()
	l := NewLeases(LeasesConfig{Shards: 4, TTL: 2 * time.Second, Renew: 500 * time.Millisecond})
	for sh := range 4 {
		l.owned[sh] = lease{validUntil: validUntil}
	}
	s := New(Config{Shards: 4, Leases: l}) // Now is time.Now: the bubble's clock
	for sh := range s.shardStates {
		s.shardStates[sh].bits.Store(shardHeld)
	}
	before(s)
	var r recorder
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	publish := func(ctx context.Context, tf []timers.TimerFired, wf []waits.WaitFired) {
		r.publish(ctx, tf, wf)
		for _, f := range tf { // each stored at once
			s.settled(subjects.TimerKey(f.AgentID, f.TimerID), f.Occurrence, 0, 0)
		}
	}
	go func() { defer close(done); s.fireLoop(ctx, publish) }()
	time.Sleep(d / 2)
	during(s)
	time.Sleep(d - d/2)
	cancel()
	<-done
	return r.got()
}

func repeating(id string, due time.Time, every time.Duration, count int64) timers.Timer {
	iv := every.Milliseconds()
	return timers.Timer{ID: id, AgentID: "a", Status: timers.TimerActive, NextFireAt: &due, IntervalMs: &iv, Repeat: true, FireCount: count}
}

func oneShot(id string, due time.Time) timers.Timer {
	return timers.Timer{ID: id, AgentID: "a", Status: timers.TimerActive, NextFireAt: &due}
}

// describe lists fires as "id#occurrence@offset from start".
func describe(fires []firedAt, start time.Time) []string {
	var out []string
	for _, f := range fires {
		out = append(out, fmt.Sprintf("%s#%d@%v", f.f.TimerID, f.f.Occurrence, f.at.Sub(start)))
	}
	return out
}

// TestFireLoopFiresOnTime: each occurrence goes out exactly at its due
// time, a repeating timer keeps its cadence, and a timer stored while the
// loop sleeps toward a later one wakes it.
func TestFireLoopFiresOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		sec := func(n float64) time.Time { return start.Add(time.Duration(n * float64(time.Second))) }
		fires := runLoop(t, sec(3600), 9*time.Second, func(s *Scheduler) {
			putTimer(t, s, repeating("rep", sec(2), 2*time.Second, 0))
			putTimer(t, s, oneShot("once", sec(3)))
		}, func(s *Scheduler) {
			// At 4.5 s the loop sleeps until 6 s; this one is due at 5 s.
			putTimer(t, s, oneShot("late", sec(5)))
		})
		want := []string{"rep#1@2s", "once#1@3s", "rep#2@4s", "late#1@5s", "rep#3@6s", "rep#4@8s"}
		if got := describe(fires, start); !slices.Equal(got, want) {
			t.Fatalf("fires %v, want %v", got, want)
		}
		for _, f := range fires {
			if !f.at.Equal(f.f.DueAt) {
				t.Errorf("%s#%d due %v fired %v", f.f.TimerID, f.f.Occurrence, f.f.DueAt.Sub(start), f.at.Sub(start))
			}
		}
	})
}

// TestFireLoopCatchUpCoalesces: a repeating timer 10.5 ticks overdue fires
// once, at once, and then keeps its original cadence: not once per missed
// tick.
func TestFireLoopCatchUpCoalesces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		due := start.Add(-10500 * time.Millisecond)
		fires := runLoop(t, start.Add(time.Hour), 3*time.Second, func(s *Scheduler) {
			putTimer(t, s, repeating("rep", due, time.Second, 4))
		}, func(*Scheduler) {})
		want := []string{"rep#5@0s", "rep#6@500ms", "rep#7@1.5s", "rep#8@2.5s"}
		if got := describe(fires, start); !slices.Equal(got, want) {
			t.Fatalf("fires %v, want %v", got, want)
		}
		if f := fires[0].f; !f.DueAt.Equal(due) || f.NextDue == nil || !f.NextDue.Equal(start.Add(500*time.Millisecond)) {
			t.Fatalf("overdue fire due %v next %v", f.DueAt.Sub(start), f.NextDue)
		}
	})
}

// TestFireLoopStopsAtLeaseValidity: once the leases' validity has passed
// (they were not renewed), nothing more fires, although timers are due.
func TestFireLoopStopsAtLeaseValidity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		fires := runLoop(t, start.Add(3500*time.Millisecond), 10*time.Second, func(s *Scheduler) {
			putTimer(t, s, repeating("rep", start.Add(time.Second), time.Second, 0))
		}, func(*Scheduler) {})
		want := []string{"rep#1@1s", "rep#2@2s", "rep#3@3s"}
		if got := describe(fires, start); !slices.Equal(got, want) {
			t.Fatalf("fires %v, want %v", got, want)
		}
	})
}

// TestLeaseValidity: a lease confirmed by a write sent at start may be
// fired on until one renew period before its key could expire, and not
// from then on.
func TestLeaseValidity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl, renew = 2 * time.Second, 500 * time.Millisecond
		start := time.Now()
		l := NewLeases(LeasesConfig{Shards: 1, TTL: ttl, Renew: renew})
		l.owned[0] = lease{validUntil: validUntil(start, ttl, renew)}
		owned := func() bool {
			o := make([]bool, 1)
			l.Owned(time.Now(), o)
			return o[0]
		}
		if !owned() {
			t.Fatal("not owned when confirmed")
		}
		time.Sleep(ttl - renew - time.Nanosecond)
		if !owned() {
			t.Fatal("not owned just before its validity ends")
		}
		time.Sleep(time.Nanosecond)
		if owned() {
			t.Fatalf("still owned %v after the write, with the key's TTL %v and renewal every %v", time.Since(start), ttl, renew)
		}
	})
}

// TestLeasePlan: what a replica gives back, seeks and wants.
func TestLeasePlan(t *testing.T) {
	for _, c := range []struct {
		held                     []int
		shards, replicas, offset int
		give, seek               []int
		want                     int
	}{
		{held: nil, shards: 8, replicas: 2, offset: 3, seek: []int{3, 4, 5, 6, 7, 0, 1, 2}, want: 4},
		{held: []int{0, 1, 2, 3, 4, 5, 6, 7}, shards: 8, replicas: 2, give: []int{4, 5, 6, 7}},
		{held: []int{1, 5}, shards: 8, replicas: 3, offset: 0, seek: []int{0, 2, 3, 4, 6, 7}, want: 1}, // share 3: 3+3+2
		{held: []int{1, 5, 6}, shards: 8, replicas: 3},
		{held: []int{2}, shards: 4, replicas: 1, offset: 2, seek: []int{3, 0, 1}, want: 3},
		{held: []int{0, 3}, shards: 2, replicas: 5, give: []int{3}}, // more replicas than shards: one each at most
	} {
		give, seek, want := plan(c.held, c.shards, c.replicas, c.offset)
		if !slices.Equal(give, c.give) || !slices.Equal(seek, c.seek) || want != c.want {
			t.Errorf("plan(%v, %d shards, %d replicas) = give %v seek %v want %d; want give %v seek %v want %d",
				c.held, c.shards, c.replicas, give, seek, want, c.give, c.seek, c.want)
		}
	}
}

// TestLeasePlanConverges plays lease rounds of replicas that follow plan
// against one bucket, in random orders, from random holdings, and as
// replicas leave: every time, within a few rounds, every shard has an
// owner, none holds more than its share, and nothing changes any more.
func TestLeasePlanConverges(t *testing.T) {
	for trial := range 300 {
		rng := rand.New(rand.NewPCG(uint64(trial), 7))
		shards, replicas := 1+rng.IntN(32), 1+rng.IntN(6)
		owner := make([]int, shards) // -1: no lease
		for s := range owner {
			owner[s] = rng.IntN(replicas+1) - 1
		}
		for replicas > 0 {
			converge(t, rng, owner, replicas, fmt.Sprintf("trial %d, %d shards, %d replicas", trial, shards, replicas))
			// The last replica dies; its leases expire.
			replicas--
			for s := range owner {
				if owner[s] == replicas {
					owner[s] = -1
				}
			}
		}
	}
}

func converge(t *testing.T, rng *rand.Rand, owner []int, replicas int, what string) {
	t.Helper()
	shards := len(owner)
	held := func(r int) []int {
		var out []int
		for s, o := range owner {
			if o == r {
				out = append(out, s)
			}
		}
		return out
	}
	for round := range 5 {
		changed := false
		for _, r := range rng.Perm(replicas) {
			give, seek, want := plan(held(r), shards, replicas, offset(fmt.Sprint("replica-", r), shards))
			for _, s := range give {
				owner[s], changed = -1, true
			}
			for _, s := range seek {
				if want == 0 {
					break
				}
				if owner[s] == -1 { // Create succeeds only on a free key
					owner[s], want, changed = r, want-1, true
				}
			}
		}
		if changed {
			continue
		}
		for s, o := range owner {
			if o < 0 {
				t.Fatalf("%s: shard %d has no owner after %d rounds: %v", what, s, round, owner)
			}
		}
		for r := range replicas {
			if n := len(held(r)); n > share(shards, replicas) {
				t.Fatalf("%s: replica %d holds %d, share %d", what, r, n, share(shards, replicas))
			}
		}
		return
	}
	t.Fatalf("%s: still changing after 5 rounds: %v", what, owner)
}
