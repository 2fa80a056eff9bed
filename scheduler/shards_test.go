package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/quotas"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

// replicaUnderTest is one replica's scheduler and leases; kill ends both
// the way a SIGKILL does: no lease is handed back.
type replicaUnderTest struct {
	sched  *Scheduler
	leases *Leases
	reg    *prometheus.Registry
	kill   func()
}

func startReplica(t *testing.T, res *engine.Resources, id string, shards int, store *timers.Store) *replicaUnderTest {
	t.Helper()
	return startReplicaWith(t, res, id, shards, store, consumer.NewInbox(res.JS, engine.InboxStream, time.Minute, nil))
}

// startReplicaWith is startReplica with the record writes going to rec and
// the deliveries to inbox (seams for slow ones).
func startReplicaWith(t *testing.T, res *engine.Resources, id string, shards int, rec Recorder, inbox *consumer.Inbox, tune ...func(*Config)) *replicaUnderTest {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &replicaUnderTest{reg: prometheus.NewRegistry()}
	r.leases = NewLeases(LeasesConfig{
		KV: res.Leases, ReplicaID: id, Shards: shards, TTL: 2 * time.Second, Renew: 500 * time.Millisecond,
		OnChange: func() { r.sched.Reshard() }, Healthy: func() (bool, string) { return r.sched.Healthy() },
	})
	cfg := Config{
		JS: res.JS, Timers: res.Timers, Waits: res.Waits, Counts: res.Counts, Records: rec,
		Inbox:  inbox,
		Leases: r.leases, Shards: shards, Registerer: r.reg,
	}
	for _, f := range tune {
		f(&cfg)
	}
	r.sched = New(cfg)
	if err := r.leases.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.sched.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	r.kill = func() { once.Do(func() { cancel(); r.sched.Stop(context.Background()) }) }
	t.Cleanup(r.kill)
	select {
	case <-r.sched.Ready():
	case <-time.After(10 * time.Second):
		t.Fatalf("replica %s not ready", id)
	}
	return r
}

// held is what r keeps: its leased shards and the keys of its entries.
func (r *replicaUnderTest) held() (leased []bool, timerKeys, waitKeys []string) {
	leased = make([]bool, len(r.sched.shardStates))
	r.leases.Leased(leased)
	r.sched.mu.Lock()
	defer r.sched.mu.Unlock()
	return leased, slices.Sorted(maps.Keys(r.sched.index.entries)), slices.Sorted(maps.Keys(r.sched.index.waits))
}

// loaded reports whether every shard r leases is loaded.
func (r *replicaUnderTest) loaded() bool {
	leased := make([]bool, len(r.sched.shardStates))
	r.leases.Leased(leased)
	for sh, ok := range leased {
		if ok && r.sched.shardStates[sh].bits.Load() != shardHeld {
			return false
		}
	}
	return true
}

func inShards(keys []string, leased []bool) []string {
	var out []string
	for _, k := range keys {
		if leased[partitions.ShardOf(k, len(leased))] {
			out = append(out, k)
		}
	}
	return out
}

// TestReplicasHoldOnlyTheirShards: two replicas divide the shards and each
// holds exactly the timers and waits of its own; the quota counts still
// cover every shard. When one dies, the other takes its shards, loads
// their records, and fires the timers that fell due meanwhile once. In
// both layouts: whole buckets watched by each, and partition buckets of
// which each watches only its shards' keys.
func TestReplicasHoldOnlyTheirShards(t *testing.T) {
	for _, partitionCount := range []int{0, 3} {
		t.Run(fmt.Sprintf("partitions=%d", partitionCount), func(t *testing.T) { testReplicasHoldOnlyTheirShards(t, partitionCount) })
	}
}

func testReplicasHoldOnlyTheirShards(t *testing.T, partitionCount int) {
	const shards = 8
	ns := natstest.Server(t)
	nc, res := natstest.ProvisionedAs(t, ns, engine.Topology{
		Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: 2 * time.Minute,
		Layout: partitions.Layout{Partitions: partitionCount, Shards: shards},
	})
	ctx := context.Background()
	var counter quotas.Counter
	tstore := timers.NewStore(res.Timers, nil, kvrec.Retention{})
	wstore := waits.NewStore(res.Waits, agents.NewStore(res.Agents), time.Now, kvrec.Retention{})
	var timerKeys, waitKeys []string
	for i := range 400 {
		tm, err := tstore.Create(ctx, fmt.Sprintf("agent%d", i%10), timers.TimerSpec{Duration: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		timerKeys = append(timerKeys, subjects.TimerKey(tm.AgentID, tm.ID))
	}
	for i := range 60 {
		w, err := wstore.Create(ctx, fmt.Sprintf("agent%d", i%10), &waits.WaitSpec{Mode: waits.WaitDuration, Target: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		waitKeys = append(waitKeys, w.Key())
	}
	slices.Sort(timerKeys)
	slices.Sort(waitKeys)

	a := startReplica(t, res, "a", shards, tstore)
	b := startReplica(t, res, "b", shards, tstore)
	testwait.Eventually(t, 15*time.Second, func() bool {
		return a.leases.Count() == shards/2 && b.leases.Count() == shards/2 && a.loaded() && b.loaded()
	}, "the shards divided and loaded")
	if partitionCount > 0 {
		counter = NewCounts(res.JS, res.Counts, nil)
		testwait.Eventually(t, 15*time.Second, func() bool {
			n, err := counter.ActiveTimers(ctx, "agent3")
			return err == nil && n == 40
		}, "the counts written")
	}
	for _, r := range []*replicaUnderTest{a, b} {
		if partitionCount == 0 {
			counter = r.sched
		}
		leased, gotTimers, gotWaits := r.held()
		if want := inShards(timerKeys, leased); !slices.Equal(gotTimers, want) {
			t.Errorf("holds %d timers, want the %d of its shards %v", len(gotTimers), len(want), leased)
		}
		if want := inShards(waitKeys, leased); !slices.Equal(gotWaits, want) {
			t.Errorf("holds %d waits, want the %d of its shards", len(gotWaits), len(want))
		}
		if n, err := counter.ActiveTimers(ctx, "agent3"); n != 40 || err != nil {
			t.Errorf("counts %d active timers of agent3 in all shards (%v), want 40", n, err)
		}
		if n, err := counter.ActiveWaits(ctx, "agent3"); n != 6 || err != nil {
			t.Errorf("counts %d waits of agent3 in all shards (%v), want 6", n, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	inbox := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(subjects.Inbox("late"), inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	b.kill()
	// Due while b's shards have no owner: those fire after the takeover.
	var due []string
	for range 10 {
		tm, err := tstore.Create(ctx, "late", timers.TimerSpec{Duration: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		due = append(due, tm.ID)
	}
	testwait.Eventually(t, 15*time.Second, func() bool { return a.leases.Count() == shards && a.loaded() }, "a takes every shard and loads it")
	_, gotTimers, gotWaits := a.held()
	if len(gotWaits) != len(waitKeys) || len(gotTimers) < len(timerKeys) {
		t.Fatalf("after the takeover a holds %d timers and %d waits, want %d+ and %d", len(gotTimers), len(gotWaits), len(timerKeys), len(waitKeys))
	}
	fired := awaitFires(t, inbox, len(due))
	time.Sleep(500 * time.Millisecond) // a repeat would come within this
	for _, id := range due {
		if fired[id] != 1 {
			t.Errorf("timer %s fired %d times", id, fired[id])
		}
	}
	select {
	case m := <-inbox:
		t.Errorf("one more fire: %s", m.Data)
	default:
	}
}

// awaitFires reads the inbox until n distinct timers have fired, within
// 10 s, and counts each one's fires.
func awaitFires(t *testing.T, inbox <-chan *nats.Msg, n int) map[string]int {
	t.Helper()
	fired := map[string]int{}
	deadline := time.After(10 * time.Second)
	for len(fired) < n {
		select {
		case m := <-inbox:
			var env subjects.Envelope
			if err := json.Unmarshal(m.Data, &env); err != nil {
				t.Fatal(err)
			}
			fired[env.Source.ID]++
		case <-deadline:
			t.Fatalf("fired %d of %d timers: %v", len(fired), n, fired)
		}
	}
	return fired
}

// TestTakeoverLoadsWhatAQuietBucketHolds: a replica that gains shards
// loads them, and fires their timers, even when the last delivery of its
// replay says messages are still pending and the bucket then stays quiet.
// The server's pending count does so under load (a message replaced while
// the consumer passed over it); a status-shaped message last in the
// bucket, which the client library drops, does so here at will. The
// gained shards used to stay loading until the bucket's next change: the
// survivor of e2e TestReplicasExactlyOnce whose shard load never finished.
func TestTakeoverLoadsWhatAQuietBucketHolds(t *testing.T) {
	const shards = 8
	ns := natstest.Server(t)
	nc, res := natstest.ProvisionedAs(t, ns, engine.Topology{
		Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: 2 * time.Minute,
		Layout: partitions.Layout{Shards: shards},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tstore := timers.NewStore(res.Timers, nil, kvrec.Retention{})
	a := startReplica(t, res, "a", shards, tstore)
	b := startReplica(t, res, "b", shards, tstore)
	testwait.Eventually(t, 15*time.Second, func() bool {
		return a.leases.Count() == shards/2 && b.leases.Count() == shards/2 && a.loaded() && b.loaded()
	}, "the shards divided and loaded")
	inbox := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(subjects.Inbox("quiet"), inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// Due after the takeover, in b's shards only (a's would fire, and
	// their record updates would end the quiet): they fire only once a
	// has loaded them.
	bs := make([]bool, shards)
	b.leases.Leased(bs)
	due := map[string]bool{}
	for len(due) < 20 {
		tm, err := tstore.Create(ctx, "quiet", timers.TimerSpec{Duration: 4 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if bs[partitions.ShardOf(subjects.TimerKey(tm.AgentID, tm.ID), shards)] {
			due[tm.ID] = true
		} else if _, err := tstore.Cancel(ctx, tm.AgentID, tm.ID); err != nil {
			t.Fatal(err)
		}
	}
	b.kill()
	junk := &nats.Msg{Subject: "$KV." + res.Timers.KVs[0].Bucket() + ".junk", Header: nats.Header{"Status": []string{"404"}}}
	if _, err := res.JS.PublishMsg(ctx, junk); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 15*time.Second, func() bool { return a.leases.Count() == shards && a.loaded() }, "a takes every shard and loads it")
	awaitFires(t, inbox, len(due))
}
