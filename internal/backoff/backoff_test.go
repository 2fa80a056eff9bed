package backoff

import (
	"context"
	"testing"
	"time"
)

func TestDelayDoublesWithinItsHalf(t *testing.T) {
	p := Policy{Min: 100 * time.Millisecond, Max: 2 * time.Second}
	for n, full := range []time.Duration{100, 200, 400, 800, 1600, 2000, 2000} {
		full *= time.Millisecond
		for range 100 {
			if d := p.Delay(n); d < full/2 || d > full {
				t.Fatalf("retry %d: %v, want %v-%v", n, d, full/2, full)
			}
		}
	}
	if d := p.Delay(1 << 20); d > p.Max {
		t.Fatalf("a late retry waits %v, over the ceiling", d)
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if (Policy{Min: time.Hour, Max: time.Hour}).Sleep(ctx, 0) {
		t.Fatal("slept through a cancelled context")
	}
	if !(Policy{Min: time.Millisecond, Max: time.Millisecond}).Sleep(context.Background(), 0) {
		t.Fatal("a short sleep reported an ended context")
	}
}
