package kvrec_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
)

// TestLeaderChanges moves the bucket's stream leader from server to server
// while writers update, read and list it: no call fails, and every update
// lands exactly once.
func TestLeaderChanges(t *testing.T) {
	began := time.Now()
	js, kv := natstest.ClusterKV(t, "recs")
	nc := js.Conn()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t.Logf("bucket ready after %s", time.Since(began))
	const writers = 8
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []error
	updates := make([]int, writers)
	var slowest time.Duration
	for w := range writers {
		wg.Go(func() {
			key := fmt.Sprintf("a.%d", w)
			for {
				select {
				case <-stop:
					return
				default:
				}
				cctx, ccancel := context.WithTimeout(context.Background(), 8*time.Second)
				start := time.Now()
				var calls int
				_, _, err := kvrec.Update(cctx, kv, key, true, bump(&calls))
				if err == nil {
					_, _, err = kvrec.Get[rec](cctx, kv, key)
				}
				if err == nil && w == 0 {
					_, err = kvrec.List[rec](cctx, kv, "a.*")
				}
				ccancel()
				mu.Lock()
				if err != nil {
					failures = append(failures, fmt.Errorf("%s: %w", key, err))
				} else {
					updates[w]++
				}
				slowest = max(slowest, time.Since(start))
				mu.Unlock()
			}
		})
	}

	leader := func() string {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		s, err := js.Stream(ctx, "KV_recs")
		if err != nil || s.CachedInfo().Cluster == nil {
			return ""
		}
		return s.CachedInfo().Cluster.Leader
	}
	moves := 0
	for range 3 {
		time.Sleep(300 * time.Millisecond) // let the writers run on the new leader
		before := leader()
		msg, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN.KV_recs", nil, 3*time.Second)
		if err != nil {
			t.Fatalf("step down: %v", err)
		}
		var resp struct {
			Error *jetstream.APIError `json:"error"`
		}
		if err := json.Unmarshal(msg.Data, &resp); err != nil || resp.Error != nil {
			t.Logf("step down refused: %s", msg.Data)
			continue
		}
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if l := leader(); l != "" && l != before {
				moves++
				break
			}
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()

	if moves == 0 {
		t.Fatal("the stream leader never moved")
	}
	for _, err := range failures {
		t.Errorf("call failed during a leader change: %v", err)
	}
	// A direct get may be served by a follower behind: one that was leader
	// a moment ago may still be catching up. Wait for each record to show
	// its updates, and never more. Twice CI saw a direct get one update
	// short for 5 and then 20 s: the stream leader, which every write and
	// CAS goes through, is then the judge of whether an update was lost,
	// and the lagging follower is logged.
	for w, n := range updates {
		key := fmt.Sprintf("a.%d", w)
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			got := read(t, kv, key)
			if got.Changes > n {
				t.Fatalf("%s shows %d changes after %d updates: one applied twice", key, got.Changes, n)
			}
			if got.Changes == n {
				break
			}
			if time.Now().After(deadline) {
				lctx, lcancel := context.WithTimeout(context.Background(), 3*time.Second)
				last, err := kvrec.LeaderLast(lctx, nc, "recs", key)
				lcancel()
				var atLeader rec
				if err == nil {
					err = json.Unmarshal(last.Data, &atLeader)
				}
				if err != nil || atLeader.Changes != n {
					t.Fatalf("%s shows %d changes after %d updates, %d at the stream leader (%v)", key, got.Changes, n, atLeader.Changes, err)
				}
				t.Logf("%s: %d changes at the stream leader, but a direct get still answers %d after 20 s: a follower lags", key, n, got.Changes)
				break
			}
		}
	}
	t.Logf("%d leader moves, %v updates, slowest call %s", moves, updates, slowest)
}
