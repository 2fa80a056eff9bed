package scheduler_test

import (
	"context"
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
