package partitions_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/partitions"
)

func TestPlaceAndParseAgree(t *testing.T) {
	for _, l := range []partitions.Layout{{Shards: 32}, {Partitions: 1, Shards: 32}, {Partitions: 4, Shards: 32}} {
		for _, id := range []string{"tmr_a", "tmr_b", "wait_c", "x"} {
			p, key, shard := l.Place("agent-1", id)
			logical, agentLen, parsed, ok := l.Parse(key)
			if !ok || logical != "agent-1."+id || agentLen != len("agent-1") {
				t.Fatalf("%+v: Parse(%q) = %q %d %v", l, key, logical, agentLen, ok)
			}
			if want := partitions.ShardOf(logical, 32); parsed != want || (l.Sharded() && shard != want) {
				t.Fatalf("%+v: %q parsed to shard %d, placed in %d, want %d", l, key, parsed, shard, want)
			}
			if p != l.PartitionOf(parsed) || p >= l.Count() {
				t.Fatalf("%+v: %q in partition %d, its shard's is %d", l, key, p, l.PartitionOf(parsed))
			}
		}
	}
}

// TestParseRefusesWhatChimeDidNotWrite: a key of the other layout, a
// shard out of range or not the one its record hashes to, and keys that
// are no records are passed over.
func TestParseRefusesWhatChimeDidNotWrite(t *testing.T) {
	sharded := partitions.Layout{Partitions: 2, Shards: 8}
	_, good, shard := sharded.Place("a", "t1")
	wrong := (shard + 1) % 8
	for _, key := range []string{
		"a.t1", "layout", "9.a.t1", "-1.a.t1", "0" + good, string(rune('0'+wrong)) + ".a.t1", "x.a.t1", "3.a.t1.more",
	} {
		if _, _, _, ok := sharded.Parse(key); ok {
			t.Errorf("sharded Parse(%q) ok", key)
		}
	}
	for _, key := range []string{"layout", "a.b.c", ".a", "a."} {
		if _, _, _, ok := (partitions.Layout{Shards: 8}).Parse(key); ok {
			t.Errorf("unsharded Parse(%q) ok", key)
		}
	}
}

func TestBase(t *testing.T) {
	for name, want := range map[string]string{
		"chime_timers": "chime_timers", "chime_timers_1": "chime_timers", "chime_waits_15": "chime_waits",
		"chime_timers_0": "chime_timers_0", "chime_timers_01": "chime_timers_01", "chime_task_outputs": "chime_task_outputs",
	} {
		if got := partitions.Base(name); got != want {
			t.Errorf("Base(%q) = %q, want %q", name, got, want)
		}
	}
}

// TestCheckFixesTheLayout: the first start records the sharded layout;
// a start with another count, or unsharded, is refused; a store with
// unsharded records refuses a sharded start.
func TestCheckFixesTheLayout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	topo := func(l partitions.Layout) engine.Topology {
		return engine.Topology{Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: time.Minute, Layout: l}
	}
	four := partitions.Layout{Partitions: 4, Shards: 32}
	_, res := natstest.ProvisionedAs(t, natstest.Server(t), topo(four))
	check := func(l partitions.Layout) error {
		return partitions.Check(ctx, res.JS, l, res.Timers.KVs[0], res.Waits.KVs[0])
	}
	for range 2 {
		if err := check(four); err != nil {
			t.Fatal(err)
		}
	}
	for _, other := range []partitions.Layout{{Shards: 32}, {Partitions: 2, Shards: 32}, {Partitions: 4, Shards: 64}} {
		if err := check(other); !errors.Is(err, partitions.ErrMismatch) {
			t.Errorf("%+v on a store of %+v: %v, want ErrMismatch", other, four, err)
		}
	}

	_, old := natstest.Provisioned(t, natstest.Server(t))
	if _, err := old.Timers.KVs[0].Put(ctx, "agent.tmr_1", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := partitions.Check(ctx, old.JS, four, old.Timers.KVs[0], old.Waits.KVs[0]); !errors.Is(err, partitions.ErrMismatch) {
		t.Errorf("sharded start on unsharded records: %v, want ErrMismatch", err)
	}
	if err := partitions.Check(ctx, old.JS, partitions.Layout{Shards: 32}, old.Timers.KVs[0], old.Waits.KVs[0]); err != nil {
		t.Errorf("unsharded start on unsharded records: %v", err)
	}
}
