package e2e_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/partitions"
)

// shardOwners reads who holds each of the 32 shards' leases ("" for none).
func shardOwners(ctx context.Context, leases jetstream.KeyValue) []string {
	out := make([]string, 32)
	for s := range out {
		if e, err := leases.Get(ctx, fmt.Sprintf("shard.%d", s)); err == nil {
			out[s] = string(e.Value())
		}
	}
	return out
}

// holdOnlyTheirShards waits until every replica's chime_timers_active is
// the number of keys (the only active timers) in the shards it owns, so
// the replicas' sum is the total: each holds its shards' timers and no
// others.
func holdOnlyTheirShards(t *testing.T, ctx context.Context, leases jetstream.KeyValue, procs map[string]*proc, keys []string) {
	t.Helper()
	var got, want map[string]int
	deadline := time.Now().Add(20 * time.Second)
	for {
		owners := shardOwners(ctx, leases)
		got, want = map[string]int{}, map[string]int{}
		for _, k := range keys {
			want[owners[partitions.ShardOf(k, len(owners))]]++
		}
		same := want[""] == 0
		for id, p := range procs {
			got[id] = int(p.metric(t, "chime_timers_active"))
			same = same && got[id] == want[id]
		}
		if same {
			t.Logf("timers held per replica: %v (of %d)", got, len(keys))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("chime_timers_active per replica %v, want the timers of its shards %v", got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestReplicasExactlyOnce runs 2 and 3 replicas against one server, creates
// 2,000 timers through any of them, SIGKILLs a replica that holds shards
// mid-run, and checks every timer is delivered exactly once and stored in
// the inbox within 5 s of its due time, the kill included; with 3
// replicas also in 4 partitions, where each watches only its shards' keys.
func TestReplicasExactlyOnce(t *testing.T) {
	for _, tc := range []struct{ replicas, partitions int }{{2, 0}, {3, 0}, {3, 4}} {
		name := fmt.Sprintf("replicas=%d", tc.replicas)
		if tc.partitions > 0 {
			name += fmt.Sprintf("/partitions=%d", tc.partitions)
		}
		t.Run(name, func(t *testing.T) { replicasExactlyOnce(t, tc.replicas, tc.partitions) })
	}
}

func replicasExactlyOnce(t *testing.T, replicas, partitionCount int) {
	ns := natstest.Server(t)
	procs := map[string]*proc{}
	for i := range replicas {
		id := fmt.Sprintf("r%d", i)
		procs[id] = startServe(t, id, "CHIME_NATS_URL="+ns.ClientURL(), fmt.Sprintf("CHIME_PARTITIONS=%d", partitionCount))
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	leases, err := js.KeyValue(ctx, engine.LeasesBucket)
	if err != nil {
		t.Fatal(err)
	}
	owners := func() map[string]int {
		out := map[string]int{}
		for _, id := range shardOwners(ctx, leases) {
			if id != "" {
				out[id]++
			}
		}
		return out
	}
	// Wait until the replicas have shared the shards out.
	eventually(t, 15*time.Second, "shards shared", func() bool {
		o := owners()
		total := 0
		for _, c := range o {
			total += c
		}
		return len(o) == replicas && total == 32
	})

	// Far-future timers stay active all along: each replica must hold
	// exactly those of the shards it owns, before the kill and after it.
	c, _ := client.New(nc, "far-agent")
	var farKeys []string
	for range 300 {
		tm, err := c.CreateTimer(ctx, time.Hour.Milliseconds(), 0, "")
		if err != nil {
			t.Fatal(err)
		}
		farKeys = append(farKeys, "far-agent."+tm.ID)
	}
	holdOnlyTheirShards(t, ctx, leases, procs, farKeys)

	const timers = 2000
	start := time.Now()
	due := make(map[string]time.Time, timers)
	dueCh := make(chan [2]any, timers)
	var answered atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	for w := range 8 {
		c, _ := client.New(nc, fmt.Sprintf("agent-%d", w))
		g.Go(func() error {
			for i := w; i < timers; i += 8 {
				// Creation under -race on 2 cores takes seconds: due times start after it.
				at := start.Add(8*time.Second + time.Duration(i)*4*time.Second/timers)
				tm, err := c.CreateTimer(gctx, max(time.Until(at).Milliseconds(), 1), 0, "")
				if err != nil {
					return err
				}
				answered.Add(1)
				dueCh <- [2]any{tm.ID, *tm.NextFireAt}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("create (%d answered): %v", answered.Load(), err)
	}
	close(dueCh)
	var last time.Time
	for d := range dueCh {
		due[d[0].(string)] = d[1].(time.Time)
		if d[1].(time.Time).After(last) {
			last = d[1].(time.Time)
		}
	}

	eventually(t, 20*time.Second, "a third delivered", func() bool { return countInbox(t, nc) >= timers/3 })
	var victim string
	for id, c := range owners() {
		if c > 0 {
			victim = id
			break
		}
	}
	killedAt := time.Now()
	procs[victim].kill()
	delivered := countInbox(t, nc)
	t.Logf("killed %s at +%v with %d delivered", victim, killedAt.Sub(start).Round(time.Millisecond), delivered)
	if delivered >= timers*9/10 {
		t.Fatalf("the kill came too late to test takeover: %d of %d already delivered", delivered, timers)
	}

	eventually(t, time.Until(last)+15*time.Second, "all delivered", func() bool { return countInbox(t, nc) >= timers })
	time.Sleep(500 * time.Millisecond) // let any duplicate show up
	seen := map[string]int{}
	var maxLate time.Duration
	for _, d := range inbox(t, nc) {
		seen[d.env.Source.ID]++
		if at, ok := due[d.env.Source.ID]; ok {
			maxLate = max(maxLate, d.stored.Sub(at))
		}
	}
	for id := range due {
		if seen[id] != 1 {
			t.Errorf("timer %s delivered %d times", id, seen[id])
		}
	}
	if len(seen) != timers {
		t.Errorf("%d timers delivered, want %d", len(seen), timers)
	}
	t.Logf("max inbox lateness (stored minus due), kill included: %v", maxLate.Round(time.Millisecond))
	delete(procs, victim)
	holdOnlyTheirShards(t, ctx, leases, procs, farKeys)
	if maxLate > 5*time.Second {
		t.Errorf("takeover took %v, want within 5s", maxLate)
	}
}
