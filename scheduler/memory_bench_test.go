package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/chime-nats/chime/internal/kvwatch"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// BenchmarkMemoryPerTimer reports the Go heap a replica keeps per active
// timer: held (its shard's entry, heap slot and presence hash) and not
// held (another replica's shard: the presence hash alone). Records are
// applied as the watch delivers them, 100k over 1000 agents with
// chime-made IDs and no summary.
//
//	go test -run '^$' -bench MemoryPerTimer -benchtime 1x ./scheduler/
func BenchmarkMemoryPerTimer(b *testing.B) {
	const n = 100_000
	due := time.Now().Add(time.Hour)
	values := make([]kvwatch.Entry, n)
	for i := range values {
		tm := timers.Timer{ID: subjects.NewTimerID(), AgentID: fmt.Sprintf("agent-%04d", i%1000), Status: timers.TimerActive, NextFireAt: &due}
		v, err := json.Marshal(tm)
		if err != nil {
			b.Fatal(err)
		}
		values[i] = kvwatch.Entry{Key: subjects.TimerKey(tm.AgentID, tm.ID), Value: v, Revision: uint64(i + 1)}
	}
	for _, held := range []bool{true, false} {
		b.Run(fmt.Sprintf("held=%v", held), func(b *testing.B) {
			for range b.N {
				s := New(Config{Shards: 32, Now: time.Now})
				if held {
					for sh := range s.shardStates {
						s.shardStates[sh].bits.Store(shardHeld)
					}
				}
				before := heapInUse()
				for _, e := range values {
					// The watch hands over the message's own subject string.
					e.Key = string([]byte(e.Key))
					s.applyTimer("", 0, e)
				}
				after := heapInUse()
				if got, _ := s.ActiveTimers(context.Background(), "agent-0001"); got != n/1000 {
					b.Fatalf("counted %d timers of agent-0001, want %d", got, n/1000)
				}
				b.ReportMetric(float64(after-before)/n, "B/timer")
				runtime.KeepAlive(s)
			}
		})
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
