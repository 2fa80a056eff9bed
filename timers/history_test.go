package timers_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// TestFinishedTimersLeaveTheirBucket: a finished timer goes from its
// bucket to the history stream, and is still read there (get, list, a
// second cancel, a cancel of a completed one) until the retention removes
// it; a live timer and a timer made with a request_id stay in the bucket.
func TestFinishedTimersLeaveTheirBucket(t *testing.T) {
	const retention = 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, _, arch, s := historyStore(t, retention)
	arch.Start(ctx)
	defer arch.Stop(context.Background())
	kv := res.Timers.KVs[0]

	var made []*timers.Timer
	for range 20 { // more than the agent's history subjects
		tm, err := s.Create(ctx, "h", timers.TimerSpec{Duration: time.Hour, Summary: "t"})
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, tm)
	}
	live, err := s.Create(ctx, "h", timers.TimerSpec{Duration: time.Hour, Summary: "live"})
	if err != nil {
		t.Fatal(err)
	}
	keyed, err := s.Create(ctx, "h", timers.TimerSpec{Duration: time.Hour, Request: subjects.RequestKey{RequestID: "r1", RequestHash: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tm := range append(made, keyed) {
		if _, err := s.Cancel(ctx, "h", tm.ID); err != nil {
			t.Fatal(err)
		}
	}
	once := made[0]
	// Gone from the bucket once archived.
	for {
		if _, err := kv.Get(ctx, "h."+once.ID); errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the cancelled timer never left its bucket")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if _, err := kv.Get(ctx, "h."+keyed.ID); err != nil {
		t.Fatalf("a timer made with a request_id left its bucket: %v", err)
	}
	for _, tm := range made {
		got, err := s.Get(ctx, "h", tm.ID)
		if err != nil || got.ID != tm.ID || got.Status != timers.TimerCancelled {
			t.Fatalf("get %s from the history: %+v %v", tm.ID, got, err)
		}
	}
	if got, err := s.Cancel(ctx, "h", once.ID); err != nil || got.Status != timers.TimerCancelled {
		t.Fatalf("a second cancel: %+v %v", got, err)
	}
	if _, err := s.Get(ctx, "other", once.ID); !errors.Is(err, subjects.ErrTimerNotFound) {
		t.Fatalf("another agent's finished timer: %v", err)
	}
	// A list, in pages of 3: the live ones, then the history, each once.
	seen := map[string]int{}
	var pos subjects.CursorPos
	for pages := 0; ; pages++ {
		if pages > 20 {
			t.Fatal("the list does not end")
		}
		page, next, err := s.List(ctx, "h", 3, pos)
		if err != nil {
			t.Fatal(err)
		}
		for _, tm := range page {
			seen[tm.ID]++
		}
		if next.Bucket >= next.Buckets {
			break
		}
		pos = next
	}
	if len(seen) != len(made)+2 || seen[live.ID] != 1 || seen[keyed.ID] != 1 {
		t.Fatalf("list: %d timers, want %d: %v", len(seen), len(made)+2, seen)
	}
	for _, tm := range made {
		if seen[tm.ID] != 1 {
			t.Fatalf("list: %s %d times", tm.ID, seen[tm.ID])
		}
	}
	// After the retention: gone from the history too.
	for {
		_, err := s.Get(ctx, "h", once.ID)
		if errors.Is(err, subjects.ErrTimerNotFound) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatal("the finished timer outlived its retention")
		case <-time.After(100 * time.Millisecond):
		}
	}
	// The others went with it, or go within moments (the last was archived
	// a little later); the one made with a request_id, from its bucket.
	for {
		page, _, err := s.List(ctx, "h", 100, subjects.CursorPos{})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 1 && page[0].ID == live.ID {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("list after the retention: %d timers, want only the live one", len(page))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestListsARecordInBothOnce: a finished timer stored in the history whose
// key still holds it in its bucket (the purge not done yet, or failed) is
// listed once, from its bucket; one only in the history is listed from
// there.
func TestListsARecordInBothOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The archiver is never started: the test moves the records itself.
	res, h, _, s := historyStore(t, time.Hour)
	kv := res.Timers.KVs[0]
	var ids []string
	for _, moved := range []bool{false, true} {
		tm, err := s.Create(ctx, "h", timers.TimerSpec{Duration: time.Hour, Summary: "t"})
		if err != nil {
			t.Fatal(err)
		}
		if tm, err = s.Cancel(ctx, "h", tm.ID); err != nil {
			t.Fatal(err)
		}
		data, err := json.Marshal(tm)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := res.JS.Publish(ctx, h.Subject("h", tm.ID), data); err != nil {
			t.Fatal(err)
		}
		if moved {
			if err := kv.Purge(ctx, "h."+tm.ID); err != nil {
				t.Fatal(err)
			}
		}
		ids = append(ids, tm.ID)
	}
	page, next, err := s.List(ctx, "h", 10, subjects.CursorPos{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tm := range page {
		got = append(got, tm.ID)
	}
	if !slices.Equal(got, ids) || next.Bucket < next.Buckets {
		t.Fatalf("list %v (next %+v), want %v once each", got, next, ids)
	}
}

// historyStore is a timers store on an embedded server whose finished
// timers go to the history stream, kept for retention, through the
// archiver returned (not started).
func historyStore(t *testing.T, retention time.Duration) (*engine.Resources, kvrec.History, *kvrec.Archiver, *timers.Store) {
	t.Helper()
	_, res := natstest.ProvisionedAs(t, natstest.Server(t), engine.Topology{
		Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: time.Minute,
		RecordRetention: retention,
	})
	r := kvrec.Retention{JS: res.JS, After: retention, Markers: time.Second}
	h := kvrec.History{JS: res.JS, Stream: engine.HistoryStream, Prefix: engine.HistoryTimers}
	arch := kvrec.NewArchiver(r, nil)
	return res, h, arch, timers.NewStore(res.Timers, nil, r).WithHistory(h, arch)
}
