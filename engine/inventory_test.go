package engine_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/partitions"
)

// TestInventoryIsWhatProvisionMakes provisions a fresh server in each
// layout and compares its streams with the inventory: a stream, bucket or
// store provisioned but not listed (so not backed up) fails here.
func TestInventoryIsWhatProvisionMakes(t *testing.T) {
	for _, l := range []partitions.Layout{{}, {Partitions: 3, Shards: 6}} {
		js := connect(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		topo := engine.Topology{Replicas: 1, Layout: l, LeaseTTL: 5 * time.Second, DedupWindow: time.Minute}
		if _, err := engine.Provision(ctx, js, topo); err != nil {
			t.Fatal(err)
		}
		var made []string
		for name := range js.StreamNames(ctx).Name() {
			made = append(made, name)
		}
		var listed []string
		for _, r := range engine.Inventory(topo) {
			listed = append(listed, r.Stream)
			if r.Kind == "" || r.Name == "" || r.Description == "" {
				t.Errorf("%+v: kind, name and description wanted", r)
			}
		}
		slices.Sort(made)
		slices.Sort(listed)
		if !slices.Equal(made, listed) {
			t.Errorf("layout %+v: provisioned %v, listed %v", l, made, listed)
		}
		if l.Sharded() && !slices.Contains(listed, "KV_chime_timers_2") || !slices.Contains(listed, "KV_chime_notifications") {
			t.Errorf("layout %+v: listed %v", l, listed)
		}
	}
}
