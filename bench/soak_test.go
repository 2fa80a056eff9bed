package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/timers"
)

// TestSoak runs a soak of a few seconds on a real `chime serve` child:
// every timer created is read once, a row comes per Every with the
// replica's memory, and the rows add up to the totals. The figures are not
// checked.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a chime process")
	}
	exe := chimeBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	o := SoakOptions{Duration: 4 * time.Second, Rate: 50, Agents: 5, Lead: time.Second, Every: time.Second, NotifyRate: 5,
		InFlight: 8, Grace: 10 * time.Second, Exe: exe, Env: []string{"CHIME_RECORD_RETENTION=10m"}, Progress: &progress}
	res, err := Soak(ctx, o)
	if err != nil {
		t.Fatalf("Soak: %v\n%s", err, progress.String())
	}
	var text bytes.Buffer
	res.WriteText(&text)
	t.Logf("%s", text.String())
	if err := res.Err(); err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	// 4 s at 50/s, paced from the start: one tick's worth may not be due
	// yet when the load stops.
	if res.Created < 190 || res.Created > 200 || res.Seen != res.Created || res.Missed != 0 || res.Duplicated != 0 || res.CreateFails != 0 {
		t.Errorf("timers: %d created, %d read, %d missed, %d duplicated, %d failed", res.Created, res.Seen, res.Missed, res.Duplicated, res.CreateFails)
	}
	if res.Notified < 15 || res.NotifyFails != 0 || res.Other != 0 {
		t.Errorf("notifications: %d sent, %d failed; %d other deliveries (notifications are not inbox deliveries)", res.Notified, res.NotifyFails, res.Other)
	}
	if !strings.Contains(strings.Join(res.Env, " "), "CHIME_RECORD_RETENTION=10m") {
		t.Errorf("settings %v: CHIME_RECORD_RETENTION not passed through", res.Env)
	}
	// A row a second while the load runs (the last tick may race the
	// load's end), and one at the end once every fire was read.
	if n := len(res.Rows); n < 4 || n > 5 {
		t.Fatalf("%d rows, want 4-5: %+v", n, res.Rows)
	}
	fires := 0
	for i, w := range res.Rows {
		fires += w.Fires
		if w.RSSBytes <= 0 || w.HeapBytes <= 0 || w.Goroutines <= 0 {
			t.Errorf("row %d: rss %d, heap %d, goroutines %d", i, w.RSSBytes, w.HeapBytes, w.Goroutines)
		}
		if i > 0 && (w.ElapsedS <= res.Rows[i-1].ElapsedS || w.Created < res.Rows[i-1].Created || w.Seen < res.Rows[i-1].Seen) {
			t.Errorf("row %d goes back: %+v after %+v", i, w, res.Rows[i-1])
		}
	}
	last := res.Rows[len(res.Rows)-1]
	if int64(fires) != res.Seen || last.Seen != res.Seen || last.Created != res.Created || last.Missed != 0 {
		t.Errorf("rows: %d fires in all, last row %+v; totals %d read of %d", fires, last, res.Seen, res.Created)
	}
	if last.LateMs.P50 <= 0 {
		t.Errorf("last row: lateness %+v", last.LateMs)
	}
	if !strings.Contains(progress.String(), soakHeader) {
		t.Errorf("no rows printed as they were taken:\n%s", progress.String())
	}
}

// TestSoakDelivered feeds one agent's reader deliveries: a fire read once
// is seen; the same delivery again before its ack was confirmed is a
// redelivery (at least once); after its ack, or stored again under
// another sequence, it is a duplicate; an envelope not a timer's fire is
// other.
func TestSoakDelivered(t *testing.T) {
	r := &soakRun{o: SoakOptions{Grace: time.Second}}
	a := &soakAgent{pend: map[string]time.Time{}, seen: map[string]uint64{}}
	r.agents = []*soakAgent{a}
	due := time.Now().Add(-time.Minute)
	fire := func(timer string, seq uint64) deliveries.InboxDelivery {
		f := &timers.TimerFired{TimerID: timer, Occurrence: 1, DueAt: due, FiredAt: due}
		env, err := json.Marshal(timers.TimerFiredEnvelope(f))
		if err != nil {
			t.Fatal(err)
		}
		return deliveries.InboxDelivery{Seq: seq, Envelope: env}
	}
	id := func(timer string) string { return (&timers.TimerFired{TimerID: timer, Occurrence: 1}).EnvelopeID() }
	a.pend[id("t1")], a.pend[id("t2")] = due, due
	if got := r.overdue(time.Now()); got != 2 {
		t.Errorf("overdue = %d, want 2", got)
	}

	now := time.Now()
	r.delivered(a, fire("t1", 1), now)
	r.delivered(a, fire("t1", 1), now) // its ack failed: back again
	a.acked = 1
	r.delivered(a, fire("t1", 1), now) // back after a confirmed ack
	r.delivered(a, fire("t1", 7), now) // stored twice
	r.delivered(a, deliveries.InboxDelivery{Seq: 8, Envelope: json.RawMessage(`{"id":"x","kind":"wait_complete"}`)}, now)

	if r.seen.Load() != 1 || r.redelivered.Load() != 1 || r.dups.Load() != 2 || r.other.Load() != 1 {
		t.Errorf("seen %d, redelivered %d, duplicated %d, other %d; want 1, 1, 2, 1", r.seen.Load(), r.redelivered.Load(), r.dups.Load(), r.other.Load())
	}
	if r.pending() != 1 || r.overdue(time.Now()) != 1 {
		t.Errorf("pending %d, overdue %d; want t2 only", r.pending(), r.overdue(time.Now()))
	}
	if len(r.late) != 1 || r.late[0] < time.Minute {
		t.Errorf("lateness %v, want one of a minute or more", r.late)
	}
}
