package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/subjects"
)

// TestQuotaDoesNotSlowOthers: agent A sits at its timer quota (50) and
// hammers creates that are all refused, while other agents' timers fire.
// Their lateness is measured side by side with a run in which A is idle,
// and logged: timing is not asserted, only that every other timer is
// delivered exactly once, every one of A's creates is refused
// quota_exceeded and A keeps exactly its 50 timers. The create rate is
// off, so every refusal goes through the quota's count.
func TestQuotaDoesNotSlowOthers(t *testing.T) {
	natsAddr := freeAddr(t)
	p := startServe(t, "quota", "CHIME_DATA_DIR="+t.TempDir(), "CHIME_NATS_LISTEN="+natsAddr,
		"CHIME_MAX_TIMERS_PER_AGENT=50", "CHIME_CREATE_RATE=0")
	nc, err := nats.Connect("nats://" + natsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	a, _ := client.New(nc, "hog")
	for range 50 {
		if _, err := a.CreateTimer(ctx, 3_600_000, 0, "hog"); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, "hog's 50 timers indexed", func() bool { return p.metric(t, "chime_timers_active") == 50 })

	idle := fireOthers(t, ctx, nc, "idle")

	hammerCtx, stopHammer := context.WithCancel(ctx)
	var refused, other atomic.Int64
	var firstOther atomic.Value
	var hammer sync.WaitGroup
	begin := time.Now()
	for range 8 {
		hammer.Go(func() {
			for hammerCtx.Err() == nil {
				_, err := a.CreateTimer(hammerCtx, 60_000, 0, "more")
				switch {
				case errors.Is(err, subjects.ErrQuotaExceeded):
					refused.Add(1)
				case hammerCtx.Err() != nil:
				default:
					other.Add(1)
					firstOther.CompareAndSwap(nil, fmt.Sprint(err))
				}
			}
		})
	}
	busy := fireOthers(t, ctx, nc, "busy")
	stopHammer()
	hammer.Wait()
	hammered := time.Since(begin)

	t.Logf("hog: %d creates refused in %v (%.0f/s) while the others' timers fired", refused.Load(), hammered.Round(time.Millisecond), float64(refused.Load())/hammered.Seconds())
	t.Logf("others' lateness (inbox stored - due), ms:  p50 / p90 / p99 / max")
	t.Logf("  hog idle:      %s", idle)
	t.Logf("  hog hammering: %s", busy)
	if n := other.Load(); n != 0 {
		t.Fatalf("%d of hog's creates were not refused quota_exceeded, first: %v", n, firstOther.Load())
	}
	if refused.Load() == 0 {
		t.Fatal("the hog made no create")
	}
	list, err := a.ListTimers(ctx, 1000)
	if err != nil || len(list) != 50 {
		t.Fatalf("hog has %d timers (%v), want its 50", len(list), err)
	}
}

// lateness holds one run's percentiles.
type lateness []time.Duration

func (l lateness) String() string {
	q := func(p float64) float64 {
		return float64(l[min(len(l)-1, int(p*float64(len(l))))].Microseconds()) / 1000
	}
	return fmt.Sprintf("%.1f / %.1f / %.1f / %.1f (n=%d)", q(.5), q(.9), q(.99), q(1), len(l))
}

// fireOthers has four agents create 50 one-shot timers each, due 3-5 s
// from their creation's start, waits until the inbox stream holds them all
// and returns their lateness; it fails unless each is stored exactly once.
func fireOthers(t *testing.T, ctx context.Context, nc *nats.Conn, run string) lateness {
	t.Helper()
	const agents, each = 4, 50
	start := time.Now()
	var mu sync.Mutex
	ids := map[string]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, agents)
	for i := range agents {
		c, _ := client.New(nc, fmt.Sprintf("other-%s-%d", run, i))
		wg.Go(func() {
			for j := range each {
				due := start.Add(3*time.Second + time.Duration(i*each+j)*2*time.Second/(agents*each))
				tm, err := c.CreateTimer(ctx, max(time.Until(due).Milliseconds(), 1), 0, "")
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				ids[tm.ID] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%s: create: %v", run, err)
	}
	prefix := "other-" + run + "-"
	var mine []delivery
	eventually(t, 30*time.Second, run+": every timer delivered", func() bool {
		mine = slices.DeleteFunc(inbox(t, nc), func(d delivery) bool { return !strings.HasPrefix(d.env.AgentID, prefix) })
		return len(mine) >= agents*each
	})
	time.Sleep(500 * time.Millisecond) // room for a duplicate to show
	mine = slices.DeleteFunc(inbox(t, nc), func(d delivery) bool { return !strings.HasPrefix(d.env.AgentID, prefix) })
	seen := map[string]int{}
	out := make(lateness, 0, len(mine))
	for _, d := range mine {
		seen[d.data.TimerID]++
		out = append(out, d.stored.Sub(d.data.DueAt))
	}
	for id := range ids {
		if seen[id] != 1 {
			t.Errorf("%s: timer %s delivered %d times", run, id, seen[id])
		}
	}
	if len(seen) != len(ids) {
		t.Errorf("%s: %d timers delivered, %d created", run, len(seen), len(ids))
	}
	slices.Sort(out)
	return out
}
