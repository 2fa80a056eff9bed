package waitfor

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
)

// TestFreshOrdersTheViewAfterWrites holds the view back (its watch cannot
// apply while the index's lock is held) and writes an entry, as another
// replica's registration would: Fresh does not return before the view
// has applied it. A Fresh that trusted the lagging view would return at
// once, with the entry missing.
func TestFreshOrdersTheViewAfterWrites(t *testing.T) {
	for _, leader := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct get", true: "leader read"}[leader], func(t *testing.T) { testFresh(t, leader) })
	}
}

// testFresh is the test, reading the last revision with a direct get (a
// one-replica bucket) or, with leader, from the stream leader as with
// replicas.
func testFresh(t *testing.T, leader bool) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ix := NewIndex(res.JS, engine.WaitForBucket, nil)
	if err := ix.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer ix.Stop(context.Background())
	if leader {
		ix.direct = nil
	}
	for i, item := range []string{"", "build"} {
		ix.mu.Lock()
		entry, _ := json.Marshal(scope{WaitID: "wf_" + item, WorkItemID: item, Wake: WakeTaskResult, Resource: "t1"})
		rev, err := res.WaitFor.Put(ctx, idxKey("lagging", item), entry)
		if err != nil {
			ix.mu.Unlock()
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- ix.Fresh(ctx) }()
		select {
		case err := <-done:
			ix.mu.Unlock()
			t.Fatalf("Fresh returned (%v) while the view could not apply revision %d", err, rev)
		case <-time.After(200 * time.Millisecond): // long enough for a Fresh that does not wait to return
		}
		ix.mu.Unlock()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := ix.entries("lagging"); len(got) != i+1 || ix.watch.Seen() < rev {
			t.Fatalf("after Fresh the view holds %+v (seen %d), want entry of revision %d", got, ix.watch.Seen(), rev)
		}
	}
	// An entry purged leaves the view.
	if err := NewStore(res.WaitFor, nil, kvrec.Retention{}).unindex(ctx, &WaitFor{ID: "wf_build", AgentID: "lagging", WorkItemID: "build"}, 0); err != nil {
		t.Fatal(err)
	}
	if err := ix.Fresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ix.entries("lagging"); len(got) != 1 || got[0].WaitID != "wf_" {
		t.Fatalf("after the purge the view holds %+v", got)
	}
}
