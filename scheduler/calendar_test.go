package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// calReplica is a scheduler that believes it owns every shard, whatever
// the lease bucket says: two of them on one store fire every occurrence
// twice over, the worst overlap a takeover can make.
func calReplica(t testing.TB, res *engine.Resources, store *timers.Store, clock func() time.Time) (stop func()) {
	t.Helper()
	const shards = 4
	l := NewLeases(LeasesConfig{Shards: shards, TTL: 2 * time.Second, Renew: 500 * time.Millisecond})
	for sh := range shards {
		l.owned[sh] = lease{validUntil: time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)}
	}
	s := New(Config{
		JS: res.JS, Timers: res.Timers, Records: store,
		Inbox:  consumer.NewInbox(res.JS, engine.InboxStream, time.Minute, nil),
		Leases: l, Shards: shards, Now: clock,
	})
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	s.Reshard() // what the leases' OnChange does
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); s.Stop(context.Background()) }) }
	t.Cleanup(stop)
	select {
	case <-s.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("scheduler not ready")
	}
	return stop
}

// calendarFire is one timer_fired envelope in the inbox stream.
type calendarFire struct {
	id        string
	timerID   string
	scheduled time.Time
}

// storedFires reads every timer_fired envelope the inbox stream holds for
// agent: what was stored, duplicates dropped by the stream included (a
// core subscription would also see the publishes the stream refused).
func calendarFires(t *testing.T, js jetstream.JetStream, agent string) []calendarFire {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, engine.InboxStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subjects.Inbox(agent)}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []calendarFire
	for pending := int(info.NumPending); pending > 0; {
		batch, err := cons.Fetch(pending, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			pending--
			var env subjects.Envelope
			var data timers.TimerFiredData
			if err := json.Unmarshal(m.Data(), &env); err != nil || json.Unmarshal(env.Data, &data) != nil || data.ScheduledAt == nil {
				t.Fatalf("not a calendar fire: %s", m.Data())
			}
			out = append(out, calendarFire{id: env.ID, timerID: data.TimerID, scheduled: *data.ScheduledAt})
		}
		if batch.Error() != nil {
			t.Fatal(batch.Error())
		}
	}
	return out
}

// TestCalendarCatchUpAfterDowntime: a replica fires a minutely calendar
// timer's first time, stops, an hour of its clock passes, and a new one
// starts on the same store (a real embedded JetStream). Each catch-up
// policy then does what it says with the sixty times it missed: skip fires
// none, one fires the first once, all fires each one within its window,
// in order; none is fired twice and the record goes on from after the
// restart.
func TestCalendarCatchUpAfterDowntime(t *testing.T) {
	for _, mode := range []string{timers.CatchUpSkip, timers.CatchUpOne, timers.CatchUpAll, "paused"} {
		t.Run(mode, func(t *testing.T) {
			ns := natstest.Server(t)
			_, res := natstest.Provisioned(t, ns)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// The clock: the real one moved so that the first minute
			// boundary is a second away; the downtime moves it an hour.
			var off atomic.Int64
			real := time.Now()
			off.Store(int64(real.Truncate(time.Minute).Add(time.Minute - time.Second).Sub(real)))
			clock := func() time.Time { return time.Now().Add(time.Duration(off.Load())) }
			store := timers.NewStore(res.Timers, clock, kvrec.Retention{JS: res.JS})
			body := fmt.Sprintf(`{"cron":"* * * * *","tz":"Europe/Berlin","catchup":%q}`, mode)
			if mode == timers.CatchUpAll || mode == "paused" {
				// Paused through the downtime, even catch-up all catches
				// nothing up.
				body = `{"cron":"* * * * *","tz":"Europe/Berlin","catchup":"all","catchup_window_ms":600000}`
			}
			spec, err := timers.DecodeCreateTimer([]byte(body), timers.TimerLimits{})
			if err != nil {
				t.Fatal(err)
			}
			agent := "down-" + mode
			tm, err := store.Create(ctx, agent, spec)
			if err != nil {
				t.Fatal(err)
			}
			first := *tm.NextFireAt

			stop := calReplica(t, res, store, clock)
			testwait.Eventually(t, 15*time.Second, func() bool {
				got, err := store.Get(ctx, agent, tm.ID)
				return err == nil && got.FireCount == 1
			}, "the first fire recorded")
			if mode == "paused" {
				if _, err := store.PauseNoted(ctx, agent, tm.ID, "down for maintenance"); err != nil {
					t.Fatal(err)
				}
			}
			stop()

			off.Add(int64(time.Hour))
			restart := clock()
			calReplica(t, res, store, clock)
			if mode == "paused" {
				if r, err := store.ResumeNoted(ctx, agent, tm.ID, "back"); err != nil || !r.NextFireAt.After(restart) {
					t.Fatalf("resume: %+v %v", r, err)
				}
			}
			var rec *timers.Timer
			testwait.Eventually(t, 20*time.Second, func() bool {
				rec, err = store.Get(ctx, agent, tm.ID)
				// Caught up: due again no earlier than the missed times.
				return err == nil && rec.NextFireAt != nil && rec.NextFireAt.After(restart.Add(-timers.MissedAfter))
			}, "the record past the downtime")

			fires := calendarFires(t, res.JS, agent)
			seen := map[time.Time]bool{}
			var missedFired []time.Time
			for _, f := range fires {
				if seen[f.scheduled] {
					t.Fatalf("%s fired twice", f.scheduled)
				}
				seen[f.scheduled] = true
				if f.scheduled.After(first) && f.scheduled.Before(restart.Add(-30*time.Second)) {
					missedFired = append(missedFired, f.scheduled)
				}
			}
			if !seen[first] {
				t.Fatalf("the first time %s is not in the inbox: %v", first, fires)
			}
			sort.Slice(missedFired, func(i, j int) bool { return missedFired[i].Before(missedFired[j]) })
			switch mode {
			case timers.CatchUpSkip:
				if len(missedFired) != 0 {
					t.Fatalf("skip fired missed times %v (record %+v)", missedFired, rec)
				}
			case "paused":
				if len(missedFired) != 0 {
					t.Fatalf("a timer paused through the downtime caught up %v", missedFired)
				}
			case timers.CatchUpOne:
				if len(missedFired) != 1 || !missedFired[0].Equal(first.Add(time.Minute)) {
					t.Fatalf("one fired %v, want only the first missed, %s", missedFired, first.Add(time.Minute))
				}
			case timers.CatchUpAll:
				// The missed times within ten minutes of the restart, each
				// one, in order; none before the window.
				if len(missedFired) < 9 || len(missedFired) > 11 {
					t.Fatalf("all fired %d missed times: %v", len(missedFired), missedFired)
				}
				for i, s := range missedFired {
					if s.Before(restart.Add(-10*time.Minute - time.Second)) {
						t.Fatalf("all fired %s, before its window", s)
					}
					if i > 0 && s.Sub(missedFired[i-1]) != time.Minute {
						t.Fatalf("all left a gap: %v", missedFired)
					}
				}
			}
			t.Logf("%s: %d fires stored, %d of the missed times fired, record fire_count %d, next %s",
				mode, len(fires), len(missedFired), rec.FireCount, rec.NextFireAt.Sub(restart))
		})
	}
}

// TestCalendarReplicasRace: two replicas that both fire every shard (the
// overlap of a takeover, made permanent) run a few per-second calendar
// timers on one store: each scheduled time reaches the inbox once, and
// every timer's record counts on.
func TestCalendarReplicasRace(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	store := timers.NewStore(res.Timers, nil, kvrec.Retention{JS: res.JS})
	spec, err := timers.DecodeCreateTimer([]byte(`{"cron":"* * * * * *","tz":"Australia/Lord_Howe","jitter":0.3}`), timers.TimerLimits{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 6 {
		tm, err := store.Create(ctx, "race", spec)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tm.ID)
	}
	stopA := calReplica(t, res, store, nil)
	stopB := calReplica(t, res, store, nil)
	testwait.Eventually(t, 30*time.Second, func() bool {
		for _, id := range ids {
			if got, err := store.Get(ctx, "race", id); err != nil || got.FireCount < 5 {
				return false
			}
		}
		return true
	}, "every timer fired five times")
	stopA()
	stopB()
	fires := calendarFires(t, res.JS, "race")
	per := map[string]map[time.Time]bool{}
	for _, f := range fires {
		if per[f.timerID] == nil {
			per[f.timerID] = map[time.Time]bool{}
		}
		if per[f.timerID][f.scheduled] {
			t.Fatalf("timer %s: %s delivered twice", f.timerID, f.scheduled)
		}
		per[f.timerID][f.scheduled] = true
	}
	for _, id := range ids {
		got, err := store.Get(ctx, "race", id)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(per[id])) < got.FireCount {
			t.Fatalf("timer %s: record counts %d fires, the inbox holds %d", id, got.FireCount, len(per[id]))
		}
	}
	t.Logf("%d fires by two racing replicas, each scheduled time once", len(fires))
}
