package kvrec

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// staleLeader is a bucket as a client sees it right after a partition
// heals, while the server that led its stream before the cut still
// believes it leads: for the calls stale picks, that server answers first,
// from its old store, where the key does not exist (it was made during the
// cut). Its gets and leader reads find nothing, and it refuses a CAS write
// at once with the real server's "wrong last sequence: 0" while the leader
// stores the write. Everything else is the real bucket on a real server.
type staleLeader struct {
	jetstream.KeyValue
	leader leaderKV
	stale  func(op string, n int) bool // op: get, update, leader; n counts from 1
	mu     sync.Mutex
	calls  map[string]int
}

func (s *staleLeader) now(op string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[op]++
	return s.stale(op, s.calls[op])
}

func (s *staleLeader) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if s.now("get") {
		return nil, jetstream.ErrKeyNotFound
	}
	return s.KeyValue.Get(ctx, key)
}

func (s *staleLeader) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if !s.now("update") {
		return s.KeyValue.Update(ctx, key, value, rev)
	}
	if _, err := s.KeyValue.Update(ctx, key, value, rev); err != nil {
		return 0, err // the leader's own answer: not what this test is about
	}
	// What the stale server says: its store has no message for key.
	_, err := s.KeyValue.Update(ctx, "absent", value, rev)
	return 0, err
}

func (s *staleLeader) leaderGet(ctx context.Context, key string) ([]byte, uint64, error) {
	if s.now("leader") {
		return nil, 0, jetstream.ErrKeyNotFound
	}
	return s.leader.leaderGet(ctx, key)
}

func (s *staleLeader) leaderRev(ctx context.Context, filter string) (uint64, error) {
	return s.leader.leaderRev(ctx, filter)
}

// leadersLast asks the real server, which answers with the stale one (not
// here) as it would after a heal: the highest answer is the real one's.
func (s *staleLeader) leadersLast(ctx context.Context, key string) (uint64, error) {
	return s.leader.leadersLast(ctx, key)
}

type counted struct {
	Done    bool `json:"done"`
	Changes int  `json:"changes"`
}

// TestStaleLeaderAfterHeal: the answers of a stale leader right after a
// heal neither lose nor repeat a change. A wait's fire completed its record,
// the stale refusal came first, the read again and the leader check found
// no record: the fire was acknowledged with its ending never delivered (two
// waits in a CI partition run). Now an answer older than a revision the
// call saw is asked again, and a refusal naming such a revision may have
// landed.
func TestStaleLeaderAfterHeal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, _, kv := recsBucket(t, ctx)
	// Complete once: a state transition, and a count of the writes that
	// applied it (the record must say 1).
	complete := func(r *counted) (bool, error) {
		r.Changes++
		if r.Done {
			return false, nil
		}
		r.Done = true
		return true, nil
	}
	never := func(string, int) bool { return false }

	for _, tc := range []struct {
		name    string
		stale   func(op string, n int) bool
		atLeast bool // the caller knows the record's revision (a wait fire)
	}{
		{"refused, then read stale, then leader stale", func(op string, n int) bool {
			return op == "update" && n == 1 || op == "get" && n == 2 || op == "leader" && n == 1
		}, false},
		{"refused, read current", func(op string, n int) bool { return op == "update" && n == 1 }, false},
		{"refused, then read stale, leader current", func(op string, n int) bool {
			return op == "update" && n == 1 || op == "get" && n == 2
		}, false},
		{"first read and leader stale, revision known", func(op string, n int) bool {
			return op == "get" && n <= 2 || op == "leader" && n <= 2
		}, true},
		{"no staleness", never, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rev, err := kv.Put(ctx, "a", []byte(`{"changes":0}`))
			if err != nil {
				t.Fatal(err)
			}
			s := &staleLeader{KeyValue: kv, leader: leaderKV{KeyValue: kv, nc: nc}, stale: tc.stale, calls: map[string]int{}}
			var opts []Option[counted]
			if tc.atLeast {
				opts = append(opts, AtLeast[counted](rev))
			}
			got, _, changed, err := UpdateRev(ctx, s, "a", false, complete, opts...)
			if err != nil || !changed || !got.Done {
				t.Fatalf("update: %+v changed %t: %v", got, changed, err)
			}
			e, err := kv.Get(ctx, "a")
			if err != nil {
				t.Fatal(err)
			}
			if string(e.Value()) != `{"done":true,"changes":1}` {
				t.Fatalf("stored %s, want the change applied once", e.Value())
			}
		})
	}

	// A miss the stale leader confirms, with no revision known, is checked
	// with every server that believes it leads (a CAS refusal each gives);
	// a key nobody holds is not found after that one question.
	if _, err := kv.Put(ctx, "a", []byte(`{"changes":0}`)); err != nil {
		t.Fatal(err)
	}
	s := &staleLeader{KeyValue: kv, leader: leaderKV{KeyValue: kv, nc: nc}, stale: func(op string, n int) bool { return n == 1 }, calls: map[string]int{}}
	if got, _, changed, err := UpdateRev(ctx, s, "a", false, complete); err != nil || !changed || !got.Done {
		t.Fatalf("a miss the stale leader confirms, revision unknown: %+v changed %t: %v", got, changed, err)
	}
	if _, _, _, err := UpdateRev(ctx, WithLeader(kv, nc), "nobody", false, complete); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a key nobody holds: %v", err)
	}
	if last, err := (leaderKV{KeyValue: kv, nc: nc}).leadersLast(ctx, "a"); err != nil || last == 0 {
		t.Fatalf("last of a on the leaders: %d %v", last, err)
	}
	if n, err := kv.Keys(ctx); err != nil || len(n) != 1 {
		t.Fatalf("the bucket holds %v (%v): the refusals must store nothing", n, err)
	}
}
