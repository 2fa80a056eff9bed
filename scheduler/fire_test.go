package scheduler_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/metrictest"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/scheduler"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// firing runs a scheduler holding every shard of 4 on a real server until
// the test ends, and returns a connection, the provisioned resources, the
// timer store and the scheduler's metrics.
func firing(t *testing.T, ctx context.Context) (*nats.Conn, *engine.Resources, *timers.Store, *prometheus.Registry) {
	t.Helper()
	ns := natstest.Server(t)
	nc, res := natstest.Provisioned(t, ns)
	const shards = 4
	store := timers.NewStore(res.Timers, nil, kvrec.Retention{})
	var sched *scheduler.Scheduler
	leases := scheduler.NewLeases(scheduler.LeasesConfig{
		KV: res.Leases, ReplicaID: "r1", Shards: shards, TTL: 2 * time.Second, Renew: 500 * time.Millisecond,
		OnChange: func() { sched.Reshard() },
	})
	reg := prometheus.NewRegistry()
	sched = scheduler.New(scheduler.Config{
		JS: res.JS, Timers: res.Timers, Records: store,
		Inbox:  consumer.NewInbox(res.JS, engine.InboxStream, time.Minute, nil),
		Leases: leases, Shards: shards, Registerer: reg,
	})
	for _, start := range []func(context.Context) error{leases.Start, sched.Start} {
		if err := start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { leases.Stop(context.Background()); sched.Stop(context.Background()) })
	return nc, res, store, reg
}

// TestTimersFireIntoInbox runs the whole fire path on a real server: a
// one-shot and a repeating timer reach the inbox and their records follow.
func TestTimersFireIntoInbox(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nc, _, store, _ := firing(t, ctx)

	inbox := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(subjects.Inbox("demo"), inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	once, err := store.Create(ctx, "demo", timers.TimerSpec{Duration: 100 * time.Millisecond, Summary: "once"})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := store.Create(ctx, "demo", timers.TimerSpec{Duration: 150 * time.Millisecond, Interval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}

	seen := map[string]int{}
	deadline := time.After(5 * time.Second)
	for seen[once.ID] < 1 || seen[rep.ID] < 3 {
		select {
		case m := <-inbox:
			var env subjects.Envelope
			if err := json.Unmarshal(m.Data, &env); err != nil {
				t.Fatal(err)
			}
			if got := m.Header.Get(subjects.HeaderKind); got != subjects.KindTimerFired {
				t.Fatalf("Chime-Kind = %q", got)
			}
			if m.Header.Get(subjects.HeaderMsgID) != env.ID {
				t.Fatalf("Nats-Msg-Id %q != envelope id %q", m.Header.Get(subjects.HeaderMsgID), env.ID)
			}
			seen[env.Source.ID]++
			if env.Source.ID == once.ID && env.Text != "once" {
				t.Errorf("one-shot text = %q", env.Text)
			}
			if env.Source.ID == rep.ID && env.Text != "timer "+rep.ID+" fired" {
				t.Errorf("repeating text = %q", env.Text)
			}
		case <-deadline:
			t.Fatalf("fires seen: %v", seen)
		}
	}
	if seen[once.ID] != 1 {
		t.Errorf("one-shot fired %d times", seen[once.ID])
	}

	testwait.Eventually(t, 5*time.Second, func() bool {
		got, err := store.Get(ctx, "demo", once.ID)
		return err == nil && got.Status == timers.TimerCompleted && got.FireCount == 1 && got.NextFireAt == nil && got.LastFiredAt != nil
	})
	testwait.Eventually(t, 5*time.Second, func() bool {
		got, err := store.Get(ctx, "demo", rep.ID)
		if err != nil || got.FireCount < 3 || got.NextFireAt == nil {
			return false
		}
		// On cadence: next = first due + k*interval exactly.
		off := got.NextFireAt.Sub(*rep.NextFireAt)
		return got.Status == timers.TimerActive && off%(200*time.Millisecond) == 0
	})
	if _, err := store.Cancel(ctx, "demo", once.ID); !errors.Is(err, subjects.ErrTimerCompleted) {
		t.Errorf("cancel completed: %v", err)
	}
}

// TestForeignRecordsAreNotFired: a timer record that chime did not write
// (undecodable, or naming another agent or ID than its key) is passed over
// and counted; chime's own timers go on firing.
func TestForeignRecordsAreNotFired(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nc, res, store, reg := firing(t, ctx)

	inbox := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(subjects.InboxWildcard, inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	due := time.Now().Add(50 * time.Millisecond).UTC()
	foreign := func(agentID, id string) []byte {
		b, _ := json.Marshal(timers.Timer{ID: id, AgentID: agentID, CreatedAt: time.Now(), DurationMs: 50, Status: timers.TimerActive, NextFireAt: &due})
		return b
	}
	for key, value := range map[string][]byte{
		"alice.tmr_a": foreign("bob", "tmr_a"),   // another agent
		"alice.tmr_b": foreign("alice", "tmr_x"), // another ID
		"alice.tmr_c": []byte("not json"),
	} {
		if _, err := res.Timers.KVs[0].Put(ctx, key, value); err != nil {
			t.Fatal(err)
		}
	}
	own, err := store.Create(ctx, "alice", timers.TimerSpec{Duration: 200 * time.Millisecond, Summary: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-inbox:
		var env subjects.Envelope
		if err := json.Unmarshal(m.Data, &env); err != nil || env.Source.ID != own.ID {
			t.Fatalf("first delivery %s: %v, want alice's own timer", m.Data, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("alice's own timer did not fire")
	}
	select {
	case m := <-inbox:
		t.Fatalf("a foreign record fired: %s", m.Data)
	case <-time.After(300 * time.Millisecond):
	}
	if got := metrictest.Counter(t, reg, "chime_records_refused_total", map[string]string{"bucket": engine.TimersBucket}); got != 3 {
		t.Errorf("chime_records_refused_total = %v, want 3", got)
	}
}
