package quotas

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/internal/metrictest"
	"github.com/chime-nats/chime/subjects"
)

// clock is a settable fake clock: the buckets refill on it alone.
func clock() (now func() time.Time, add func(time.Duration)) {
	t := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	return func() time.Time { return t }, func(d time.Duration) { t = t.Add(d) }
}

// TestRatePerAgent: an agent gets its burst at once, then one create per
// 1/rate; a refusal says when the next is taken; other agents are not
// touched; each refusal is counted.
func TestRatePerAgent(t *testing.T) {
	now, add := clock()
	reg := prometheus.NewRegistry()
	q := New(Config{Rate: 10, Burst: 3, Now: now, Registerer: reg})
	for i := range 3 {
		if err := q.Timer(t.Context(), "a"); err != nil {
			t.Fatalf("create %d within the burst: %v", i, err)
		}
	}
	err := q.Wait(t.Context(), "a") // waits share the agent's bucket
	rl, ok := errors.AsType[*RateLimited](err)
	if !ok || !errors.Is(err, subjects.ErrRateLimited) || rl.RetryAfter() != 100*time.Millisecond {
		t.Fatalf("over the burst: %v", err)
	}
	if want := "agent a is creating timers and waits faster than 10 a second (CHIME_CREATE_RATE); retry in 100ms"; subjects.AsError(err).Message != want {
		t.Fatalf("message %q", subjects.AsError(err).Message)
	}
	if err := q.Timer(t.Context(), "b"); err != nil {
		t.Fatalf("another agent: %v", err)
	}
	add(60 * time.Millisecond)
	if err := q.Timer(t.Context(), "a"); !errors.Is(err, subjects.ErrRateLimited) || err.(*RateLimited).After != 40*time.Millisecond {
		t.Fatalf("60 ms later: %v", err)
	}
	add(40 * time.Millisecond)
	if err := q.Timer(t.Context(), "a"); err != nil {
		t.Fatalf("a token later: %v", err)
	}
	add(time.Hour) // refills to the burst, not beyond
	for i := range 4 {
		if err := q.Timer(t.Context(), "a"); (err == nil) != (i < 3) {
			t.Fatalf("after an hour, create %d: %v", i, err)
		}
	}
	if n := metrictest.Counter(t, reg, "chime_quota_refusals_total", map[string]string{"quota": Rate}); n != 3 {
		t.Fatalf("rate refusals counted %v, want 3", n)
	}
	if n := metrictest.Counter(t, reg, "chime_quota_refusals_total", map[string]string{"quota": Timers}); n != 0 {
		t.Fatalf("timers refusals counted %v", n)
	}
}

// TestRateMemoryBounded: the buckets of at most MaxAgents agents are kept.
// Full buckets (idle agents) go first, since forgetting them changes
// nothing, so an agent in debt keeps its debt while idle ones come and go.
func TestRateMemoryBounded(t *testing.T) {
	now, add := clock()
	q := New(Config{Rate: 1, Burst: 2, MaxAgents: 10, Now: now})
	for i := range 9 {
		if err := q.Timer(t.Context(), fmt.Sprintf("idle-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	add(10 * time.Second) // the idle ones are full again
	for range 2 {
		if err := q.Timer(t.Context(), "busy"); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Timer(t.Context(), "newcomer"); err != nil { // the map is full: the idle ones go
		t.Fatal(err)
	}
	if n := q.rate.len(); n != 2 {
		t.Fatalf("%d buckets after evicting the full ones, want busy and newcomer", n)
	}
	if err := q.Timer(t.Context(), "busy"); !errors.Is(err, subjects.ErrRateLimited) {
		t.Fatalf("busy agent after the eviction: %v", err)
	}
	// More agents at once than the map holds: it stays bounded.
	for i := range 1000 {
		_ = q.Timer(t.Context(), fmt.Sprintf("crowd-%d", i))
		if n := q.rate.len(); n > 10 {
			t.Fatalf("%d buckets kept, at most 10", n)
		}
	}
}

// TestZeroIsOff: without limits nothing is refused.
func TestZeroIsOff(t *testing.T) {
	q := New(Config{})
	for range 1000 {
		if err := q.Timer(t.Context(), "a"); err != nil {
			t.Fatal(err)
		}
		if err := q.Wait(t.Context(), "a"); err != nil {
			t.Fatal(err)
		}
	}
	if m := q.MinInterval(); m != 0 {
		t.Fatalf("min interval %v", m)
	}
}

// TestOpenQuestions: below the bound an ask is admitted, at it refused
// with the variable named, whatever the create rate; 0 is no bound.
func TestOpenQuestions(t *testing.T) {
	reg := prometheus.NewRegistry()
	q := New(Config{MaxQuestions: 2, Rate: 1, Burst: 1, Registerer: reg})
	for open := range 2 {
		if err := q.Question("a", open); err != nil {
			t.Fatalf("%d open: %v", open, err)
		}
	}
	err := q.Question("a", 2)
	if !errors.Is(err, subjects.ErrQuotaExceeded) ||
		subjects.AsError(err).Message != "agent a has 2 open questions; at most 2 are allowed (CHIME_MAX_OPEN_QUESTIONS_PER_AGENT)" {
		t.Fatalf("at the bound: %v", err)
	}
	if err := q.Timer(t.Context(), "a"); err != nil {
		t.Fatalf("asks took the create rate: %v", err)
	}
	if n := metrictest.Counter(t, reg, "chime_quota_refusals_total", map[string]string{"quota": Questions}); n != 1 {
		t.Fatalf("%v question refusals counted, want 1", n)
	}
	if err := New(Config{}).Question("a", 1000); err != nil {
		t.Fatalf("no bound: %v", err)
	}
}
