package kvrec_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
)

// staleKV answers Get as a follower that lags would: from what it held
// before (held), or not at all (nil). Everything else is the real bucket.
type staleKV struct {
	jetstream.KeyValue
	held jetstream.KeyValueEntry
}

func (s staleKV) Get(context.Context, string) (jetstream.KeyValueEntry, error) {
	if s.held == nil {
		return nil, jetstream.ErrKeyNotFound
	}
	return s.held, nil
}

// TestUpdateConfirmsOnTheLeader: an update that would end without writing,
// because its read found no record or nothing to change, reads the leader
// first and decides again on what it holds; without WithLeader the stale
// read's decision stands (what a wait fire did after a partition: it found
// no wait on a server still catching up, and the wait was never completed).
func TestUpdateConfirmsOnTheLeader(t *testing.T) {
	nc, kv := startEngine(t).connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	put(t, kv, "a", rec{ID: "a", Changes: 1})
	old, err := kv.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	put(t, kv, "a", rec{ID: "a", Changes: 2})
	// Armed at 2 only: 3 once done.
	complete := func(r *rec) (bool, error) {
		if r.Changes != 2 {
			return false, nil
		}
		r.Changes = 3
		return true, nil
	}

	missing := staleKV{KeyValue: kv}
	if _, _, err := kvrec.Update(ctx, missing, "a", false, complete); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("without the leader, a stale miss: %v, want not found", err)
	}
	got, changed, err := kvrec.Update(ctx, kvrec.WithLeader(missing, nc), "a", false, complete)
	if err != nil || !changed || got.Changes != 3 {
		t.Fatalf("a stale miss confirmed on the leader: %+v %t %v", got, changed, err)
	}

	put(t, kv, "a", rec{ID: "a", Changes: 2})
	behind := staleKV{KeyValue: kv, held: old}
	if got, changed, err := kvrec.Update(ctx, behind, "a", false, complete); err != nil || changed || got.Changes != 1 {
		t.Fatalf("without the leader, a stale no-op: %+v %t %v", got, changed, err)
	}
	got, changed, err = kvrec.Update(ctx, kvrec.WithLeader(behind, nc), "a", false, complete)
	if err != nil || !changed || got.Changes != 3 {
		t.Fatalf("a stale no-op confirmed on the leader: %+v %t %v", got, changed, err)
	}

	// A current no-op stays one, and a record the leader lacks too is
	// not found.
	if got, changed, err := kvrec.Update(ctx, kvrec.WithLeader(kv, nc), "a", false, complete); err != nil || changed || got.Changes != 3 {
		t.Fatalf("a current no-op: %+v %t %v", got, changed, err)
	}
	if _, _, err := kvrec.Update(ctx, kvrec.WithLeader(kv, nc), "nope", false, complete); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a key nobody holds: %v", err)
	}
	if err := kv.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := kvrec.Update(ctx, kvrec.WithLeader(behind, nc), "a", false, complete); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a record deleted since the stale read: %v", err)
	}
}

// staleOnce serves its first Watch from stale, a copy that lags (a list's
// watch placed on a server still catching up); the others from the real
// bucket.
type staleOnce struct {
	jetstream.KeyValue
	stale   jetstream.KeyValue
	watched atomic.Int32
}

func (s *staleOnce) Watch(ctx context.Context, keys string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	if s.watched.Add(1) == 1 {
		return s.stale.Watch(ctx, keys, opts...)
	}
	return s.KeyValue.Watch(ctx, keys, opts...)
}

// TestListConfirmsOnTheLeader: a list read from a copy that lacks the
// latest record (so its last revision is behind the leader's) is read
// again, and the record is in the list; without WithLeader the stale list
// stands (an intervention would not cancel a wait made while the copy's
// server was cut off).
func TestListConfirmsOnTheLeader(t *testing.T) {
	e := startEngine(t)
	nc, kv := e.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stale, err := e.jetstream(t).CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "recs_copy"})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []jetstream.KeyValue{kv, stale} {
		put(t, b, "a.1", rec{ID: "1"})
		put(t, b, "a.2", rec{ID: "2"})
	}
	put(t, kv, "a.3", rec{ID: "3"}) // stored while the copy was away

	got, err := kvrec.List[rec](ctx, &staleOnce{KeyValue: kv, stale: stale}, "a.*")
	if err != nil || len(got) != 2 {
		t.Fatalf("without the leader, the stale list: %+v %v, want its 2 records", got, err)
	}
	got, err = kvrec.List[rec](ctx, kvrec.WithLeader(&staleOnce{KeyValue: kv, stale: stale}, nc), "a.*")
	if err != nil || len(got) != 3 {
		t.Fatalf("a stale list confirmed on the leader: %+v %v, want all 3 records", got, err)
	}
	// Deletions count: a list whose last revision is a deletion is current.
	if err := kv.Delete(ctx, "a.3"); err != nil {
		t.Fatal(err)
	}
	got, err = kvrec.List[rec](ctx, kvrec.WithLeader(kv, nc), "a.*")
	if err != nil || len(got) != 2 {
		t.Fatalf("after a deletion: %+v %v, want 2 records", got, err)
	}
}
