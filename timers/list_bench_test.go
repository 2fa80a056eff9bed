package timers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// The fleet BenchmarkList lists from: otherAgents agents with otherTimers
// active timers each, one agent ("few") with fewTimers, and one ("many")
// with manyTimers active and as many finished ones kept for retention,
// written interleaved as a fleet writes them over time.
const (
	otherAgents = 1000
	otherTimers = 10
	fewTimers   = 10
	manyTimers  = 10_000
)

// BenchmarkList shows what one timer.list page {limit: 10} costs for an
// agent with 10 timers and for one with 10,000 active and 10,000 finished
// ones kept, among 1,000 other agents (10,000 more timers): the first page,
// and for the second agent also a page half way through.
//
// Run: go test -run '^$' -bench BenchmarkList -benchtime 200x ./timers/
func BenchmarkList(b *testing.B) {
	_, res := natstest.Provisioned(b, natstest.Server(b))
	fillFleet(b, res.JS)
	store := timers.NewStore(res.Timers, nil, kvrec.Retention{JS: res.JS})
	ctx := context.Background()
	// Half way through the many timers: ten pages of 1000.
	var deep subjects.CursorPos
	for range 10 {
		list, next, err := store.List(ctx, "many", 1000, deep)
		if err != nil || len(list) != 1000 {
			b.Fatalf("walk: %d timers, %v", len(list), err)
		}
		deep = next
	}
	for _, c := range []struct {
		name, agent string
		from        subjects.CursorPos
	}{{"few", "few", subjects.CursorPos{}}, {"many", "many", subjects.CursorPos{}}, {"many-deep", "many", deep}} {
		b.Run(c.name, func(b *testing.B) {
			var took []time.Duration
			for b.Loop() {
				start := time.Now()
				list, _, err := store.List(ctx, c.agent, 10, c.from)
				if err != nil || len(list) != 10 {
					b.Fatalf("list: %d timers, %v", len(list), err)
				}
				took = append(took, time.Since(start))
			}
			reportMedian(b, took)
		})
	}
}

// reportMedian reports the median of took: on a shared machine the mean
// carries others' pauses.
func reportMedian(b *testing.B, took []time.Duration) {
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Nanoseconds()), "p50-ns")
}

// fillFleet stores the benchmark's timers straight into the bucket.
func fillFleet(b *testing.B, js jetstream.JetStream) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	due := time.Now().Add(time.Hour)
	n := 0
	put := func(agent string, i int, status timers.TimerStatus) {
		t := timers.Timer{
			ID: fmt.Sprintf("tmr_%s_%07d", status, i), AgentID: agent, CreatedAt: time.Now(), DurationMs: 3600000,
			Status: status, Summary: "benchmark",
		}
		if status == timers.TimerActive {
			t.NextFireAt = &due
		}
		data, _ := json.Marshal(t)
		m := &nats.Msg{Subject: "$KV." + engine.TimersBucket + "." + subjects.TimerKey(agent, t.ID), Data: data}
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
		if n++; n%4096 == 0 { // in windows: a full async window stalls
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				b.Fatal("timers not stored in time")
			}
		}
	}
	for i := range manyTimers {
		put("many", i, timers.TimerActive)
		put("many", i, timers.TimerCancelled)
		put(fmt.Sprintf("other%d", i%otherAgents), i, timers.TimerActive)
		if i%(manyTimers/fewTimers) == 0 {
			put("few", i, timers.TimerActive)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal("timers not stored in time")
	}
}
