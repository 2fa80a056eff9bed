package scheduler_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/scheduler"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// Live timers in every case: 1000 over 10 agents, 10 of them the listed
// agent's.
const (
	liveTimers   = 1000
	listedAgent  = "hist"
	listedLive   = 10
	historyCount = 100_000
)

// BenchmarkHistory shows what start-up and listings cost with and without
// a history of finished timers: the time from a scheduler's start to its
// index holding every stored timer (Ready), and one listing of an agent
// whose history it is. Each case holds the same live timers and:
//
//   - none: no finished timers;
//   - expired: 100k finished timers written with a 1 s TTL, as the write
//     that finishes a timer now is, and past it (their markers too);
//   - expired-markers: the same within the markers' TTL, when every
//     expired timer has left its marker (a start in the minute after
//     100k timers expired at once);
//   - kept: 100k finished timers without a TTL, as every finished timer
//     was kept before records expired.
//
// Run: go test -run '^$' -bench BenchmarkHistory -benchtime 20x ./scheduler/
func BenchmarkHistory(b *testing.B) {
	for _, c := range []struct {
		name    string
		history int
		ttl     bool
		markers time.Duration
	}{
		{"none", 0, false, time.Second}, {"expired-100k", historyCount, true, time.Second},
		{"expired-markers-100k", historyCount, true, time.Hour}, {"kept-100k", historyCount, false, time.Second},
	} {
		b.Run(c.name, func(b *testing.B) {
			_, res := natstest.ProvisionedAs(b, natstest.Server(b), engine.Topology{
				Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: time.Minute,
				MarkerTTL: c.markers,
			})
			ctx := context.Background()
			fill(b, res.JS, c.history, c.ttl, c.markers > time.Minute)
			b.Run("index-load", func(b *testing.B) {
				for b.Loop() {
					loadIndex(b, res)
				}
			})
			store := timers.NewStore(res.Timers, nil, kvrec.Retention{JS: res.JS})
			b.Run("list", func(b *testing.B) {
				for b.Loop() {
					list, _, err := store.List(ctx, listedAgent, subjects.DefaultListLimit, subjects.CursorPos{})
					if err != nil || len(list) < listedLive {
						b.Fatalf("list: %d timers, %v", len(list), err)
					}
				}
			})
		})
	}
}

// fill stores the live timers and history finished ones, with a 1 s TTL
// when ttl is set; then it waits until they are gone, and their markers
// too unless markers stay.
func fill(b *testing.B, js jetstream.JetStream, history int, ttl, markers bool) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	due := time.Now().Add(time.Hour)
	put := func(agent string, i int, status timers.TimerStatus) {
		t := timers.Timer{
			ID: fmt.Sprintf("tmr_%s_%07d", status, i), AgentID: agent, CreatedAt: time.Now(), DurationMs: 3600000,
			Status: status, Summary: "benchmark",
		}
		if status == timers.TimerActive {
			t.NextFireAt = &due
		}
		data, _ := json.Marshal(t)
		m := &nats.Msg{Subject: "$KV." + engine.TimersBucket + "." + subjects.TimerKey(agent, t.ID), Data: data, Header: nats.Header{}}
		if ttl && status != timers.TimerActive {
			m.Header.Set(jetstream.MsgTTLHeader, "1s")
		}
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
	}
	for i := range liveTimers {
		agent := fmt.Sprintf("live%d", i%10)
		if i < listedLive {
			agent = listedAgent
		}
		put(agent, i, timers.TimerActive)
	}
	settle := func() {
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			b.Fatal("history not stored in time")
		}
	}
	for i := range history {
		put(listedAgent, i, timers.TimerCancelled)
		if i%4096 == 4095 {
			settle() // in windows: a full async window stalls
		}
	}
	settle()
	if !ttl {
		return
	}
	s, err := js.Stream(ctx, "KV_"+engine.TimersBucket)
	if err != nil {
		b.Fatal(err)
	}
	for {
		info, err := s.Info(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if !markers && info.State.Msgs == liveTimers || markers && info.State.LastSeq == uint64(liveTimers+2*history) {
			return
		}
		select {
		case <-ctx.Done():
			b.Fatalf("history not expired: %d messages left", info.State.Msgs)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// loadIndex starts a scheduler, waits until its index is loaded, and
// stops it.
func loadIndex(b *testing.B, res *engine.Resources) {
	b.Helper()
	var s *scheduler.Scheduler
	leases := scheduler.NewLeases(scheduler.LeasesConfig{
		KV: res.Leases, ReplicaID: "bench", Shards: 4, TTL: 2 * time.Second, Renew: 500 * time.Millisecond,
		OnChange: func() { s.Reshard() },
	})
	s = scheduler.New(scheduler.Config{
		JS: res.JS, Timers: res.Timers, Waits: res.Waits,
		Inbox:   consumer.NewInbox(res.JS, engine.InboxStream, time.Minute, nil),
		Records: timers.NewStore(res.Timers, nil, kvrec.Retention{}), Leases: leases, Shards: 4, Log: slog.New(slog.DiscardHandler),
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := leases.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer leases.Stop(context.Background())
	if err := s.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer s.Stop(context.Background())
	select {
	case <-s.Ready():
	case <-ctx.Done():
		b.Fatal("index not loaded")
	}
}
