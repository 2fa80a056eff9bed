package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// changes is the replica's chime_scheduler_changes_total for timers, as
// its registry exposes it.
func changes(t *testing.T, r *replicaUnderTest) int {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "chime_scheduler_changes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "bucket" && l.GetValue() == "chime_timers" {
					return int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return 0
}

// TestChangesCountedPerReplica: chime_scheduler_changes_total counts what
// each replica's watches deliver. In the unsharded layout both of two
// replicas receive every create; in the sharded one each receives only
// the creates of the shards it holds, and together they receive each
// create once.
func TestChangesCountedPerReplica(t *testing.T) {
	for _, partitionCount := range []int{0, 3} {
		t.Run(fmt.Sprintf("partitions=%d", partitionCount), func(t *testing.T) {
			const shards, n = 8, 200
			ns := natstest.Server(t)
			_, res := natstest.ProvisionedAs(t, ns, engine.Topology{
				Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: 2 * time.Minute,
				Layout: partitions.Layout{Partitions: partitionCount, Shards: shards},
			})
			store := timers.NewStore(res.Timers, nil, kvrec.Retention{})
			a := startReplica(t, res, "a", shards, store)
			b := startReplica(t, res, "b", shards, store)
			testwait.Eventually(t, 15*time.Second, func() bool {
				return a.leases.Count() == shards/2 && b.leases.Count() == shards/2 && a.loaded() && b.loaded()
			}, "the shards divided and loaded")
			rs := []*replicaUnderTest{a, b}
			before := make([]int, len(rs))
			for i, r := range rs {
				before[i] = changes(t, r)
			}
			ctx := context.Background()
			inShard := make([]int, shards)
			for i := range n {
				tm, err := store.Create(ctx, fmt.Sprintf("agent%d", i%10), timers.TimerSpec{Duration: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				inShard[partitions.ShardOf(subjects.TimerKey(tm.AgentID, tm.ID), shards)]++
			}
			for i, r := range rs {
				want := n
				if partitionCount > 0 {
					leased := make([]bool, shards)
					r.leases.Leased(leased)
					want = 0
					for sh, ok := range leased {
						if ok {
							want += inShard[sh]
						}
					}
				}
				testwait.Eventually(t, 15*time.Second, func() bool {
					return changes(t, r)-before[i] >= want
				}, "replica %d's changes counted", i)
				time.Sleep(100 * time.Millisecond) // more would come within this
				if got := changes(t, r) - before[i]; got != want {
					t.Errorf("replica %d: %d timer changes delivered, want %d", i, got, want)
				}
			}
		})
	}
}
