package scheduler

import (
	"fmt"
	"testing"
)

func TestIndexFiresOnlyOwnedShardsInDueOrder(t *testing.T) {
	ix := newIndex(4)
	for i := range 40 {
		key := fmt.Sprintf("agent.t%d", i)
		e := &entry{key: key, agentLen: len("agent"), due: int64(100 - i), at: int64(100 - i), occ: 1, shard: shardOf(key, 4), pos: -1}
		ix.entries[key] = e
		ix.arm(e)
	}
	owned := []bool{true, false, true, false}
	next, ok := ix.next(owned)
	if !ok {
		t.Fatal("nothing armed in owned shards")
	}
	got := ix.popDue(owned, 80, 1000, nil)
	for _, e := range got {
		if !owned[e.shard] || e.due > 80 {
			t.Fatalf("popped %s (shard %d, due %d)", e.key, e.shard, e.due)
		}
		if e.due < next {
			t.Fatalf("next %d is after popped due %d", next, e.due)
		}
		if e.agentID() != "agent" || e.itemID() == "" {
			t.Fatalf("key split: %q %q", e.agentID(), e.itemID())
		}
	}
	// Everything due and owned was popped; unowned shards kept theirs.
	for s, h := range ix.shards {
		for _, e := range h {
			if owned[s] && e.due <= 80 {
				t.Fatalf("left due entry %s in owned shard %d", e.key, s)
			}
		}
	}
	if n := len(ix.popDue(owned, 80, 1000, nil)); n != 0 {
		t.Fatalf("second pop found %d", n)
	}
	limited := ix.popDue([]bool{true, true, true, true}, 1000, 3, nil)
	if len(limited) != 3 {
		t.Fatalf("max ignored: %d", len(limited))
	}
	ix.remove(false, limited[0].key)
	if _, ok := ix.entries[limited[0].key]; ok {
		t.Fatal("remove kept the entry")
	}
}
