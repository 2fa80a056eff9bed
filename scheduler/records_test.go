package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chime-nats/chime/timers"
)

// TestRecordQueueKeepsOrderAndNeverBlocks pushes more than any channel
// the ack loop used to block on, pops across compactions in order, and
// stops a waiting pop with its context.
func TestRecordQueueKeepsOrderAndNeverBlocks(t *testing.T) {
	q := newRecordQueue()
	const n = 50_000
	for i := range n {
		q.push(timers.TimerFired{TimerID: fmt.Sprint(i)})
	}
	if q.len() != n {
		t.Fatalf("len = %d, want %d", q.len(), n)
	}
	ctx := context.Background()
	for i := range n {
		if i == n/2 { // pushes interleaved with pops keep their place
			q.push(timers.TimerFired{TimerID: "late"})
		}
		f, ok := q.pop(ctx)
		if !ok || f.TimerID != fmt.Sprint(i) {
			t.Fatalf("pop %d = %q, %v", i, f.TimerID, ok)
		}
	}
	if f, _ := q.pop(ctx); f.TimerID != "late" || q.len() != 0 {
		t.Fatalf("last = %q, len %d", f.TimerID, q.len())
	}
	ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, ok := q.pop(ctx); ok {
		t.Fatal("pop on an empty queue returned")
	}
}

// TestWorkersShareOneBurstYield: once the burst's yield has run out, an
// update does not stand back again while the same fires stay in flight.
func TestWorkersShareOneBurstYield(t *testing.T) {
	s := New(Config{Shards: 1})
	s.pending <- pendingFire{}
	start := time.Now()
	if !s.yieldToFires(context.Background()) {
		t.Fatal("yield stopped")
	}
	if waited := time.Since(start); waited < burstYield {
		t.Fatalf("first update stood back %v, want >= %v", waited, burstYield)
	}
	start = time.Now()
	for range 100 {
		s.yieldToFires(context.Background())
	}
	if waited := time.Since(start); waited >= burstYield {
		t.Fatalf("100 later updates stood back %v in all", waited)
	}
	<-s.pending
	s.yieldToFires(context.Background())
	if s.burstStart.Load() != 0 {
		t.Fatal("burst not over once nothing is in flight")
	}
}

// BenchmarkRecordQueueBurst pushes a burst of 50k delivered fires, as the
// ack loop does, then drains them. Run:
// go test -run '^$' -bench RecordQueueBurst -benchmem ./scheduler/
func BenchmarkRecordQueueBurst(b *testing.B) {
	q := newRecordQueue()
	f := timers.TimerFired{AgentID: "agent", TimerID: "tmr_0123456789", Occurrence: 1, DueAt: time.Now(), FiredAt: time.Now(), Text: "timer fired"}
	ctx := context.Background()
	for b.Loop() {
		for range 50_000 {
			q.push(f)
		}
		for range 50_000 {
			q.pop(ctx)
		}
	}
}
