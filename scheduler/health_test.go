package scheduler

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/kvwatch"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/timers"
)

// TestShardedHealthIsPerShard: in the sharded layout a watch not live
// (a gained shard's not started yet, one re-creating its consumer) stops
// only its shard from firing; the replica stays healthy, and keeps its
// other shards, while any loaded shard it holds can fire.
func TestShardedHealthIsPerShard(t *testing.T) {
	layout := partitions.Layout{Partitions: 2, Shards: 4}
	_, res := natstest.ProvisionedAs(t, natstest.Server(t), engine.Topology{
		Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: time.Minute, Layout: layout,
	})
	s := New(Config{Shards: 4, Timers: res.Timers, Waits: res.Waits, Counts: res.Counts})
	live := kvwatch.New(kvwatch.Config{JS: res.JS, Bucket: res.Timers.KVs[0].Bucket(), Keys: partitions.ShardKeys(0), Apply: func(kvwatch.Entry) {}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_ = live.Start(ctx)
	defer live.Stop(context.Background())
	<-live.Loaded()
	testwait.Eventually(t, 15*time.Second, func() bool { ok, _ := live.Live(); return ok }, "the watch live")
	stalled := kvwatch.New(kvwatch.Config{JS: res.JS, Bucket: res.Timers.KVs[1].Bucket(), Keys: partitions.ShardKeys(1), Apply: func(kvwatch.Entry) {}})
	s.shardStates[0].watches = []*kvwatch.Watch{live}
	s.shardStates[1].watches = []*kvwatch.Watch{stalled} // never started
	s.shardStates[0].bits.Store(shardHeld)
	s.shardStates[1].bits.Store(shardHeld)
	if ok, why := s.Healthy(); !ok {
		t.Fatalf("unhealthy with one live shard: %s", why)
	}
	owned := []bool{true, true, false, false}
	s.liveOnly(owned)
	if !owned[0] || owned[1] {
		t.Fatalf("fireable %v, want only shard 0", owned)
	}
	live.Stop(context.Background())
	if ok, _ := s.Healthy(); ok {
		t.Fatal("healthy with no loaded shard's watch live")
	}
}

// TestHealthyWhileStarting: the leases, started before the scheduler, ask
// Healthy while Start makes the whole-bucket watches; with -race this
// failed when Start appended them unguarded.
func TestHealthyWhileStarting(t *testing.T) {
	_, res := natstest.ProvisionedAs(t, natstest.Server(t), engine.Topology{
		Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: time.Minute,
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leases := NewLeases(LeasesConfig{KV: res.Leases, ReplicaID: "a", Shards: 4, TTL: 2 * time.Second, Renew: 500 * time.Millisecond})
	s := New(Config{
		JS: res.JS, Timers: res.Timers, Waits: res.Waits, Records: timers.NewStore(res.Timers, nil, kvrec.Retention{}),
		Inbox: consumer.NewInbox(res.JS, engine.InboxStream, time.Minute, nil), Leases: leases, Shards: 4,
	})
	asking := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-asking:
				return
			default:
				s.Healthy()
			}
		}
	})
	err := s.Start(ctx)
	close(asking)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background())
	select {
	case <-s.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("not ready")
	}
	testwait.Eventually(t, 15*time.Second, func() bool { ok, _ := s.Healthy(); return ok }, "healthy once started")
}
