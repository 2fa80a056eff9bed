package timers_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// TestStore runs the timer store against a real bucket: create, get, list
// newest first, record fires in order, cancel rules, and the errors.
func TestStore(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	s := timers.NewStore(res.Timers, func() time.Time { return now }, kvrec.Retention{JS: res.JS})

	once, err := s.Create(ctx, "st", timers.TimerSpec{Duration: time.Second, Summary: "once"})
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Millisecond)
	rep, err := s.Create(ctx, "st", timers.TimerSpec{Duration: time.Second, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "st", once.ID); err != nil || got.Summary != "once" || !got.NextFireAt.Equal(now.Add(-time.Millisecond).Add(time.Second)) {
		t.Fatalf("get: %+v %v", got, err)
	}
	if _, err := s.Get(ctx, "other", once.ID); !errors.Is(err, subjects.ErrTimerNotFound) {
		t.Fatalf("another agent's timer: %v", err)
	}
	list, next, err := s.List(ctx, "st", 10, subjects.CursorPos{})
	if err != nil || len(list) != 2 || list[0].ID != once.ID || next.Bucket != next.Buckets {
		t.Fatalf("list in the order of last change: %+v %+v %v", list, next, err)
	}
	list, next, err = s.List(ctx, "st", 1, subjects.CursorPos{})
	if err != nil || len(list) != 1 || list[0].ID != once.ID {
		t.Fatalf("limit: %+v %v", list, err)
	}
	if list, last, err := s.List(ctx, "st", 1, next); err != nil || len(list) != 1 || list[0].ID != rep.ID || last.Bucket != last.Buckets {
		t.Fatalf("second page: %+v %+v %v", list, last, err)
	}

	// The one-shot fires: completed, and a repeat of its record update
	// changes nothing.
	fire := &timers.TimerFired{AgentID: "st", TimerID: once.ID, Occurrence: 1, DueAt: *once.NextFireAt, FiredAt: *once.NextFireAt}
	for i, want := range []bool{true, false} {
		if applied, err := s.ApplyFire(ctx, fire); err != nil || applied != want {
			t.Fatalf("apply %d: %v %v", i, applied, err)
		}
	}
	if _, err := s.Cancel(ctx, "st", once.ID); !errors.Is(err, subjects.ErrTimerCompleted) {
		t.Fatalf("cancel completed: %v", err)
	}
	// The repeating one: occurrence 2 before 1 waits; then in order.
	d1 := *rep.NextFireAt
	d2 := d1.Add(time.Second)
	second := &timers.TimerFired{AgentID: "st", TimerID: rep.ID, Occurrence: 2, DueAt: d2, FiredAt: d2}
	if _, err := s.ApplyFire(ctx, second); !errors.Is(err, timers.ErrOutOfOrder) {
		t.Fatalf("2 before 1: %v", err)
	}
	if ok, err := s.ApplyFire(ctx, &timers.TimerFired{AgentID: "st", TimerID: rep.ID, Occurrence: 1, DueAt: d1, FiredAt: d1, NextDue: &d2}); !ok || err != nil {
		t.Fatalf("1: %v %v", ok, err)
	}
	if ok, err := s.ApplyFire(ctx, second); !ok || err != nil {
		t.Fatalf("2: %v %v", ok, err)
	}
	got, _ := s.Get(ctx, "st", rep.ID)
	if got.FireCount != 2 || got.Status != timers.TimerActive || !got.NextFireAt.Equal(d2.Add(time.Second)) {
		t.Fatalf("repeating after 2 fires: %+v", got)
	}
	for range 2 { // cancel, and cancel again: a no-op
		c, err := s.Cancel(ctx, "st", rep.ID)
		if err != nil || c.Status != timers.TimerCancelled || c.NextFireAt != nil {
			t.Fatalf("cancel: %+v %v", c, err)
		}
	}
	if ok, err := s.ApplyFire(ctx, &timers.TimerFired{AgentID: "st", TimerID: rep.ID, Occurrence: 3, DueAt: d2.Add(time.Second)}); ok || err != nil {
		t.Fatalf("fire after cancel: %v %v", ok, err)
	}
	if _, err := s.Cancel(ctx, "st", "tmr_missing"); !errors.Is(err, subjects.ErrTimerNotFound) {
		t.Fatalf("cancel missing: %v", err)
	}
	if ok, err := s.ApplyFire(ctx, &timers.TimerFired{AgentID: "st", TimerID: "tmr_missing", Occurrence: 1}); ok || err != nil {
		t.Fatalf("fire of a missing timer: %v %v", ok, err)
	}
}
