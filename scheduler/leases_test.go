package scheduler_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/scheduler"
)

// TestLeasesShareAndTakeOver runs two lease keepers on a real server: they
// split the shards, and when one dies without releasing (its context ends),
// the other holds all shards once the dead one's leases expire.
func TestLeasesShareAndTakeOver(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns) // lease TTL 2s
	const shards = 8
	newKeeper := func(id string) *scheduler.Leases {
		return scheduler.NewLeases(scheduler.LeasesConfig{KV: res.Leases, ReplicaID: id, Shards: shards, TTL: 2 * time.Second, Renew: 250 * time.Millisecond})
	}
	ctxA, killA := context.WithCancel(context.Background())
	a, b := newKeeper("a"), newKeeper("b")
	if err := a.Start(ctxA); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer b.Stop(context.Background())
	testwait.Eventually(t, 10*time.Second, func() bool { return a.Count() == shards/2 && b.Count() == shards/2 })

	owned := make([]bool, shards)
	a.Owned(time.Now(), owned)
	mineB := make([]bool, shards)
	b.Owned(time.Now(), mineB)
	for s := range owned {
		if owned[s] == mineB[s] {
			t.Fatalf("shard %d owned by both or neither: a=%v b=%v", s, owned, mineB)
		}
	}

	killA() // dies without handing back its leases
	start := time.Now()
	testwait.Eventually(t, 10*time.Second, func() bool { return b.Count() == shards })
	t.Logf("takeover after %v", time.Since(start))
}

// TestLeasesStepBackOnlyForOthers: a replica that cannot fire gives its
// shards to one that can, but when none can (a cause they share, such as
// a stream between leaders) each keeps what it holds rather than all
// giving every shard away at once; healthy again, they share.
func TestLeasesStepBackOnlyForOthers(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	const shards = 8
	var okA, okB atomic.Bool
	okA.Store(true)
	okB.Store(true)
	newKeeper := func(id string, ok *atomic.Bool) *scheduler.Leases {
		return scheduler.NewLeases(scheduler.LeasesConfig{KV: res.Leases, ReplicaID: id, Shards: shards, TTL: 2 * time.Second, Renew: 250 * time.Millisecond,
			Healthy: func() (bool, string) {
				if ok.Load() {
					return true, ""
				}
				return false, "publishes fail"
			}})
	}
	a, b := newKeeper("a", &okA), newKeeper("b", &okB)
	for _, l := range []*scheduler.Leases{a, b} {
		if err := l.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer l.Stop(context.Background())
	}
	testwait.Eventually(t, 10*time.Second, func() bool { return a.Count() == shards/2 && b.Count() == shards/2 }, "shared")

	okA.Store(false)
	testwait.Eventually(t, 10*time.Second, func() bool { return a.Count() == 0 && b.Count() == shards }, "a steps back for b")
	if a.Benched() == "" || b.Benched() != "" {
		t.Fatalf("benched: a %q, b %q", a.Benched(), b.Benched())
	}

	okB.Store(false) // now neither can fire
	testwait.Eventually(t, 10*time.Second, func() bool { return b.Benched() == "" && a.Benched() == "" }, "neither benched")
	// b keeps every shard it holds through several rounds: nobody could
	// fire them better.
	for range 8 {
		if n := a.Count() + b.Count(); n != shards {
			t.Fatalf("with neither able to fire, %d of %d shards are held (a %d, b %d)", n, shards, a.Count(), b.Count())
		}
		time.Sleep(250 * time.Millisecond)
	}

	okA.Store(true)
	okB.Store(true)
	testwait.Eventually(t, 10*time.Second, func() bool { return a.Count() == shards/2 && b.Count() == shards/2 }, "shared again")
}

// TestLeasesRegainedWake: leases that lapse unconfirmed (rounds failing
// while a server restarts) and are then confirmed again are shards the
// replica may fire again, and OnChange says so although it holds the same
// shards: the fire loop, which found nothing to fire, sleeps until told.
// Before, a replica kept its leases and fired none of its shards after
// such a lapse (chime-bench chaos, 336 fires lost after a server kill).
func TestLeasesRegainedWake(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	const shards = 4
	var clock atomic.Int64 // unix ns
	clock.Store(time.Now().UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	var changes atomic.Int32
	l := scheduler.NewLeases(scheduler.LeasesConfig{KV: res.Leases, ReplicaID: "a", Shards: shards, TTL: 2 * time.Second, Renew: 250 * time.Millisecond,
		Now: now, OnChange: func() { changes.Add(1) }})
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer l.Stop(context.Background())
	testwait.Eventually(t, 10*time.Second, func() bool { return l.Count() == shards }, "all shards held")
	owned := make([]bool, shards)
	l.Owned(now(), owned)
	if slices.Contains(owned, false) {
		t.Fatalf("owned %v after the first round", owned)
	}

	// The leases' validity passes unconfirmed, as when rounds fail.
	before := changes.Load()
	clock.Add(int64(2 * time.Second))
	l.Owned(now(), owned)
	if slices.Contains(owned, true) {
		t.Fatalf("owned %v past the leases' validity", owned)
	}
	testwait.Eventually(t, 10*time.Second, func() bool { return changes.Load() > before }, "OnChange once the lapsed leases are confirmed again")
	l.Owned(now(), owned)
	if slices.Contains(owned, false) || l.Count() != shards {
		t.Fatalf("owned %v, %d held, after the leases were confirmed again", owned, l.Count())
	}
}
