package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/partitions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// The cadence tests reproduce, on a real server, the skipped ticks seen on
// loaded clusters (issue 19): a repeating timer whose stored occurrences
// jump cadence ticks that no catch-up fire covers
// (timers.CadenceCoverage). Each injects one slow part through a seam.

// lostAcks stores every publish but, for the message IDs marked, reports
// the ack after a delay, or (lose) reports it lost after the delay: a
// publish whose ack came late, or too late, under load.
type lostAcks struct {
	jetstream.JetStream
	mu    sync.Mutex
	delay map[string]slowAck
}

type slowAck struct {
	after time.Duration
	lose  bool
}

func (j *lostAcks) lose(msgID string, after time.Duration) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.delay[msgID] = slowAck{after: after, lose: true}
}

func (j *lostAcks) slow(msgID string, after time.Duration) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.delay[msgID] = slowAck{after: after}
}

func (j *lostAcks) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	fut, err := j.JetStream.PublishMsgAsync(m, opts...)
	if err != nil {
		return fut, err
	}
	j.mu.Lock()
	d, ok := j.delay[m.Header.Get(jetstream.MsgIDHeader)]
	delete(j.delay, m.Header.Get(jetstream.MsgIDHeader))
	j.mu.Unlock()
	if !ok {
		return fut, nil
	}
	late := &lostAck{msg: fut.Msg(), ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	go func() {
		var ack *jetstream.PubAck
		select {
		case ack = <-fut.Ok():
		case e := <-fut.Err():
			late.err <- e
			return
		}
		time.Sleep(d.after)
		if d.lose {
			late.err <- errors.New("test: publish ack timed out (the message was stored)")
			return
		}
		late.ok <- ack
	}()
	return late, nil
}

type lostAck struct {
	msg *nats.Msg
	ok  chan *jetstream.PubAck
	err chan error
}

func (a *lostAck) Ok() <-chan *jetstream.PubAck { return a.ok }
func (a *lostAck) Err() <-chan error            { return a.err }
func (a *lostAck) Msg() *nats.Msg               { return a.msg }

// stuckRecords never writes a record: each update hangs until its context
// ends (the scheduler gives each 5 s, then retries).
type stuckRecords struct{}

func (stuckRecords) ApplyFire(ctx context.Context, _ *timers.TimerFired) (bool, error) {
	<-ctx.Done()
	return false, ctx.Err()
}

// storedFires reads the timer's stored occurrences from the inbox stream.
func storedFires(t *testing.T, js jetstream.JetStream, agentID, timerID string) []timers.StoredFire {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, engine.InboxStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subjects.Inbox(agentID)}})
	if err != nil {
		t.Fatal(err)
	}
	var out []timers.StoredFire
	for left := cons.CachedInfo().NumPending; left > 0; {
		batch, err := cons.Fetch(int(min(left, 256)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			left = md.NumPending
			var env struct {
				Kind string                `json:"kind"`
				Data timers.TimerFiredData `json:"data"`
			}
			if err := json.Unmarshal(m.Data(), &env); err != nil {
				t.Fatal(err)
			}
			if env.Kind == subjects.KindTimerFired && env.Data.TimerID == timerID {
				out = append(out, timers.StoredFire{Occurrence: env.Data.Occurrence, DueAt: env.Data.DueAt, NextDueAt: env.Data.NextDueAt, StoredAt: md.Timestamp})
			}
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// checkCovered fails t when a tick of the stored cadence is not covered.
func checkCovered(t *testing.T, fires []timers.StoredFire, interval time.Duration) {
	t.Helper()
	c := timers.CadenceCoverage(fires, interval)
	if c.Uncovered > 0 {
		for _, f := range fires {
			var next string
			if f.NextDueAt != nil {
				next = f.NextDueAt.Format("15:04:05.000")
			}
			t.Logf("occurrence %d due %s next %s stored %s", f.Occurrence, f.DueAt.Format("15:04:05.000"), next, f.StoredAt.Format("15:04:05.000"))
		}
		t.Fatalf("%d of %d cadence ticks not covered by a catch-up fire, the first due %s", c.Uncovered, c.Ticks, c.FirstUncovered.Format("15:04:05.000"))
	}
	t.Logf("%d stored occurrences over %d ticks, all covered", len(fires), c.Ticks)
}

func cadenceServer(t *testing.T, shards int) *engine.Resources {
	return cadenceServerWindow(t, shards, 2*time.Minute)
}

// cadenceServerWindow provisions with the inbox's dedup window.
func cadenceServerWindow(t *testing.T, shards int, window time.Duration) *engine.Resources {
	ns := natstest.Server(t)
	_, res := natstest.ProvisionedAs(t, ns, engine.Topology{
		Replicas: 1, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour, DedupWindow: window,
		Layout: partitions.Layout{Shards: shards},
	})
	return res
}

// inboxOf is the delivery path over js with a minute's dedup window.
func inboxOf(js jetstream.JetStream) *consumer.Inbox {
	return consumer.NewInbox(js, engine.InboxStream, time.Minute, nil)
}

// TestCadenceSurvivesALostPublishAck: occurrence 2's envelope is stored
// but its ack is reported lost a second later, while occurrences 3-5 went
// out meanwhile. The retries of 2-5 are duplicates of what is stored; the
// cadence after them must still cover every tick.
func TestCadenceSurvivesALostPublishAck(t *testing.T) {
	const shards, interval = 4, 300 * time.Millisecond
	res := cadenceServer(t, shards)
	js := &lostAcks{JetStream: res.JS, delay: map[string]slowAck{}}
	store := timers.NewStore(res.Timers, nil, kvrec.Retention{})
	startReplicaWith(t, res, "a", shards, store, inboxOf(js))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tm, err := store.Create(ctx, "slowack", timers.TimerSpec{Duration: interval, Interval: interval})
	if err != nil {
		t.Fatal(err)
	}
	js.lose((&timers.TimerFired{TimerID: tm.ID, Occurrence: 2}).EnvelopeID(), 3*interval+interval/3)
	testwait.Eventually(t, 20*time.Second, func() bool {
		got, err := store.Get(ctx, tm.AgentID, tm.ID)
		return err == nil && got.FireCount >= 12
	}, "twelve occurrences recorded")
	checkCovered(t, storedFires(t, res.JS, tm.AgentID, tm.ID), interval)
}

// storedThenKilled starts replica a on a fresh server with record updates
// that never land, creates a repeating timer for agent, waits until a has
// stored at least n of its occurrences, and kills a (no lease handed
// back): what the takeover tests start from.
func storedThenKilled(t *testing.T, shards int, interval time.Duration, agent string, n int) (*engine.Resources, *timers.Store, *timers.Timer, context.Context) {
	t.Helper()
	res := cadenceServer(t, shards)
	store := timers.NewStore(res.Timers, nil, kvrec.Retention{})
	a := startReplicaWith(t, res, "a", shards, stuckRecords{}, inboxOf(res.JS))
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	t.Cleanup(cancel)
	tm, err := store.Create(ctx, agent, timers.TimerSpec{Duration: interval, Interval: interval})
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, func() bool {
		return len(storedFires(t, res.JS, tm.AgentID, tm.ID)) >= n
	}, fmt.Sprintf("a stores %d occurrences", n))
	a.kill()
	return res, store, tm, ctx
}

// TestCadenceSurvivesATakeoverBehindSlowRecords: replica a fires a
// repeating timer but never gets a record update written; it dies (no
// lease handed back) and b takes the shard over from the stale record,
// refiring what a stored (duplicates) while the clock has moved on.
func TestCadenceSurvivesATakeoverBehindSlowRecords(t *testing.T) {
	const shards, interval = 4, 300 * time.Millisecond
	res, store, tm, ctx := storedThenKilled(t, shards, interval, "takeover", 5)
	stored := len(storedFires(t, res.JS, tm.AgentID, tm.ID))
	if got, err := store.Get(ctx, tm.AgentID, tm.ID); err != nil || got.FireCount != 0 {
		t.Fatalf("record %+v, %v: want none applied", got, err)
	}
	b := startReplicaWith(t, res, "b", shards, store, inboxOf(res.JS))
	testwait.Eventually(t, 15*time.Second, func() bool { return b.leases.Count() == shards }, "b takes every shard")
	testwait.Eventually(t, 20*time.Second, func() bool {
		got, err := store.Get(ctx, tm.AgentID, tm.ID)
		return err == nil && got.FireCount >= int64(stored)+5
	}, "b fires on past what a stored")
	checkCovered(t, storedFires(t, res.JS, tm.AgentID, tm.ID), interval)
}

// TestCadenceSurvivesATakeoverBehindASlowDuplicateAck: as above, and b's
// refire of the last occurrence a stored is acknowledged (a duplicate)
// only after two intervals: b must not fire the next occurrence on its own
// clock's cadence meanwhile, but go on from what a stored.
func TestCadenceSurvivesATakeoverBehindASlowDuplicateAck(t *testing.T) {
	const shards, interval = 4, 300 * time.Millisecond
	res, store, tm, ctx := storedThenKilled(t, shards, interval, "slowdup", 4)
	stored := storedFires(t, res.JS, tm.AgentID, tm.ID)
	last := stored[len(stored)-1].Occurrence
	js := &lostAcks{JetStream: res.JS, delay: map[string]slowAck{}}
	js.slow((&timers.TimerFired{TimerID: tm.ID, Occurrence: last}).EnvelopeID(), 2*interval)
	b := startReplicaWith(t, res, "b", shards, store, inboxOf(js))
	testwait.Eventually(t, 15*time.Second, func() bool { return b.leases.Count() == shards }, "b takes every shard")
	testwait.Eventually(t, 20*time.Second, func() bool {
		got, err := store.Get(ctx, tm.AgentID, tm.ID)
		return err == nil && got.FireCount >= last+5
	}, "b fires on past what a stored")
	checkCovered(t, storedFires(t, res.JS, tm.AgentID, tm.ID), interval)
}

// unreadable is a JetStream whose streams cannot be looked up: an
// envelope stored in the inbox cannot be read back (a copy that does not
// answer, under a partition), though publishes go through.
type unreadable struct{ jetstream.JetStream }

func (unreadable) Stream(context.Context, string) (jetstream.Stream, error) {
	return nil, errors.New("stream lookups refused (test)")
}

// TestCadenceSurvivesAnUnreadableDuplicate: as the takeover above, but b
// cannot read back what a stored. Each of b's fires of a's occurrences is
// a duplicate whose stored next_due_at b cannot learn; b goes on from the
// earliest one any attempt could have stated, so its first new occurrence
// catches up on a's cadence instead of starting a later one (which left
// the ticks between uncovered).
func TestCadenceSurvivesAnUnreadableDuplicate(t *testing.T) {
	const shards, interval = 4, 300 * time.Millisecond
	res, store, tm, ctx := storedThenKilled(t, shards, interval, "unread", 4)
	last := storedFires(t, res.JS, tm.AgentID, tm.ID)
	// b starts well after a's next due time, so its own would skip ticks.
	time.Sleep(4 * interval)
	b := startReplicaWith(t, res, "b", shards, store, inboxOf(unreadable{res.JS}), func(c *Config) { c.AdoptLimit = 200 * time.Millisecond })
	testwait.Eventually(t, 15*time.Second, func() bool { return b.leases.Count() == shards }, "b takes every shard")
	testwait.Eventually(t, 20*time.Second, func() bool {
		got, err := store.Get(ctx, tm.AgentID, tm.ID)
		return err == nil && got.FireCount >= last[len(last)-1].Occurrence+3
	}, "b fires on past what a stored")
	checkCovered(t, storedFires(t, res.JS, tm.AgentID, tm.ID), interval)
}

// TestCadenceSurvivesATakeoverBeyondTheDedupWindow: as the takeover above,
// but b starts after the inbox's dedup window (1 s here) has forgotten what
// a stored: b finds each stored occurrence by searching the inbox, and
// must go on from its next_due_at rather than number the cadence anew
// (which stored a second envelope for an occurrence number a had used).
func TestCadenceSurvivesATakeoverBeyondTheDedupWindow(t *testing.T) {
	const shards, interval, window = 4, 300 * time.Millisecond, time.Second
	res := cadenceServerWindow(t, shards, window)
	store := timers.NewStore(res.Timers, nil, kvrec.Retention{})
	a := startReplicaWith(t, res, "a", shards, stuckRecords{}, consumer.NewInbox(res.JS, engine.InboxStream, window, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	tm, err := store.Create(ctx, "forgot", timers.TimerSpec{Duration: interval, Interval: interval})
	if err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, func() bool {
		return len(storedFires(t, res.JS, tm.AgentID, tm.ID)) >= 4
	}, "a stores four occurrences")
	a.kill()
	last := storedFires(t, res.JS, tm.AgentID, tm.ID)
	b := startReplicaWith(t, res, "b", shards, store, consumer.NewInbox(res.JS, engine.InboxStream, window, nil))
	testwait.Eventually(t, 15*time.Second, func() bool { return b.leases.Count() == shards }, "b takes every shard")
	testwait.Eventually(t, 20*time.Second, func() bool {
		got, err := store.Get(ctx, tm.AgentID, tm.ID)
		return err == nil && got.FireCount >= last[len(last)-1].Occurrence+5
	}, "b fires on past what a stored")
	fires := storedFires(t, res.JS, tm.AgentID, tm.ID)
	seen := map[int64]int{}
	for _, f := range fires {
		if seen[f.Occurrence]++; seen[f.Occurrence] == 2 {
			t.Errorf("occurrence %d stored twice", f.Occurrence)
		}
	}
	checkCovered(t, fires, interval)
}
