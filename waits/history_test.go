package waits_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waits"
)

// TestEndedWaitsLeaveTheirBucket: an ended wait whose ID chime picked goes
// to the history stream and is still read there (get, list, a second end);
// one with the caller's id stays in its bucket, so that id stays taken.
func TestEndedWaitsLeaveTheirBucket(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.ProvisionedAs(t, ns, engine.Topology{
		Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: time.Minute,
		RecordRetention: time.Hour,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := kvrec.Retention{JS: res.JS, After: time.Hour, Markers: time.Second}
	arch := kvrec.NewArchiver(r, nil)
	arch.Start(ctx)
	defer arch.Stop(context.Background())
	s := waits.NewStore(res.Waits, agents.NewStore(res.Agents), nil, r).
		WithHistory(kvrec.History{JS: res.JS, Stream: engine.HistoryStream, Prefix: engine.HistoryWaits}, arch)
	kv := res.Waits.KVs[0]

	picked, err := s.Create(ctx, "h", &waits.WaitSpec{Mode: waits.WaitDuration, Target: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	named, err := s.Create(ctx, "h", &waits.WaitSpec{ID: "mine", Mode: waits.WaitDuration, Target: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	byIntervention, err := s.Create(ctx, "h", &waits.WaitSpec{Mode: waits.WaitDuration, Target: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*waits.Wait{byIntervention, picked, named} {
		by := waits.CancelByRequest
		if w == byIntervention {
			by = "iv_x"
		}
		if _, ended, err := s.Cancel(ctx, "h", w.ID, by, "Wait cancelled."); err != nil || !ended {
			t.Fatalf("cancel %s: %v %v", w.ID, ended, err)
		}
	}
	for {
		if _, err := kv.Get(ctx, "h."+picked.ID); errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the cancelled wait never left its bucket")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if _, err := kv.Get(ctx, "h.mine"); err != nil {
		t.Fatalf("a wait with the caller's id left its bucket: %v", err)
	}
	// Archived in the order they ended: the one cancelled by an
	// intervention came first, and stays for the intervention's
	// redelivery, which lists the bucket.
	if all, err := s.List(ctx, "h"); err != nil || len(all) != 2 {
		t.Fatalf("the bucket holds %+v (%v), want the waits of the caller's id and of the intervention", all, err)
	}
	if _, err := kv.Get(ctx, "h."+byIntervention.ID); err != nil {
		t.Fatalf("a wait cancelled by an intervention left its bucket: %v", err)
	}
	if got, err := s.Get(ctx, "h", picked.ID); err != nil || got.Status != waits.WaitCancelled {
		t.Fatalf("get from the history: %+v %v", got, err)
	}
	if got, ended, err := s.Cancel(ctx, "h", picked.ID, waits.CancelByRequest, "Wait cancelled."); err != nil || !ended || got.Status != waits.WaitCancelled {
		t.Fatalf("a second cancel: %+v %v %v", got, ended, err)
	}
	page, next, err := s.Page(ctx, "h", 10, subjects.CursorPos{})
	if err != nil || len(page) != 3 || page[0].ID != byIntervention.ID || page[1].ID != "mine" || page[2].ID != picked.ID || next.Bucket < next.Buckets {
		t.Fatalf("list: %+v %+v %v", page, next, err)
	}
}
