package timers_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// TestCalendarRequestValidation: each bad calendar create is refused with
// a text that says what is wrong; a good one states every policy.
func TestCalendarRequestValidation(t *testing.T) {
	bad := []struct{ body, msg string }{
		{`{"cron":"61 * * * *"}`, `cron "61 * * * *": end of range (61) above maximum (59): 61`},
		{`{"cron":"* * *"}`, `cron "* * *": want 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds first), not 3`},
		{`{"cron":"@fortnightly"}`, `cron "@fortnightly": unrecognized descriptor: @fortnightly`},
		{`{"cron":"@every 1h"}`, `cron "@every 1h": @every is a fixed period, not a calendar: use interval_ms`},
		{`{"cron":"TZ=UTC 0 * * * *"}`, `give the zone in tz, not in the expression`},
		{`{"cron":"0 9 * * *","tz":"Mars/Olympus"}`, `tz "Mars/Olympus" is not an IANA time zone (e.g. Europe/Berlin)`},
		{`{"cron":"0 9 * * *","tz":"Local"}`, `tz "Local" is not an IANA time zone`},
		{`{"cron":"0 9 * * *","interval_ms":60000}`, `interval_ms and cron do not go together: give one of them`},
		{`{"cron":"0 9 * * *","duration_ms":1000}`, `duration_ms and cron do not go together`},
		{`{"cron":"0 9 * * *","dst_repeated":"twice"}`, `dst_repeated must be first, last or both, not "twice"`},
		{`{"cron":"0 9 * * *","dst_skipped":"later"}`, `dst_skipped must be shift or skip, not "later"`},
		{`{"cron":"0 9 * * *","catchup":"some"}`, `catchup must be skip, one or all, not "some"`},
		{`{"cron":"0 9 * * *","catchup":"all","catchup_window_ms":-1}`, `catchup_window_ms must not be negative, not -1`},
		{`{"cron":"0 9 * * *","catchup_window_ms":1.5}`, `catchup_window_ms must be an integer of milliseconds, not 1.5`},
		{`{"cron":"0 9 * * *","catchup":"all","catchup_window_ms":604800001}`, `catchup_window_ms is too large: at most 604800000`},
		{`{"cron":"0 9 * * *","catchup":"skip","catchup_window_ms":1000}`, `catchup_window_ms applies to catchup one or all, not skip`},
		{`{"cron":"0 9 * * *","jitter":1}`, `jitter is a share of the period: at least 0 and below 1, not 1`},
		{`{"cron":"0 9 * * *","jitter":-0.1}`, `jitter is a share of the period: at least 0 and below 1, not -0.1`},
		{`{"cron":"0 9 * * *","jitter":0.1,"jitter_max_ms":3600001}`, `jitter_max_ms is too large: at most 3600000`},
		{`{"cron":"0 9 * * *","jitter_max_ms":-5}`, `jitter_max_ms must not be negative, not -5`},
		{`{"cron":"0 9 * * *","max_fires":0}`, `max_fires must be a positive integer, not 0`},
		{`{"cron":"0 9 * * *","start_at":"tomorrow"}`, `start_at must be an RFC 3339 time with a zone`},
		{`{"cron":"0 9 * * *","start_at":"2027-01-02T00:00:00Z","end_at":"2027-01-01T00:00:00Z"}`, `end_at 2027-01-01T00:00:00Z is not after start_at 2027-01-02T00:00:00Z`},
		{`{"duration_ms":1000,"tz":"Europe/Berlin"}`, `tz applies to calendar timers: give cron too`},
		{`{"duration_ms":1000,"max_fires":3}`, `max_fires applies to calendar timers: give cron too`},
		{`{"cron":"* * * * * *"}`, `cron "* * * * * *" fires every 1s; calendar timers may fire at most every 60000 ms`},
		{`{"cron":"0 9 * * *","bogus":1}`, `bogus`},
	}
	for _, c := range bad {
		_, err := timers.DecodeCreateTimer([]byte(c.body), timers.TimerLimits{MinInterval: time.Minute})
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != subjects.CodeInvalidRequest || !strings.Contains(e.Message, c.msg) {
			t.Errorf("%s: got %v, want invalid_request containing %q", c.body, err, c.msg)
		}
	}
	spec, err := timers.DecodeCreateTimer([]byte(`{"cron":"0 9 * * 1-5","tz":"Europe/Berlin","jitter":0.1,"summary":"standup"}`), timers.TimerLimits{MinInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := timers.CalendarSpec{Cron: "0 9 * * 1-5", TZ: "Europe/Berlin", DSTRepeated: "first", DSTSkipped: "shift", CatchUp: "one", Jitter: 0.1, JitterMaxMs: 60000}
	if spec.Calendar.Cron != want.Cron || spec.Calendar.TZ != want.TZ || spec.Calendar.DSTRepeated != want.DSTRepeated || spec.Calendar.DSTSkipped != want.DSTSkipped ||
		spec.Calendar.CatchUp != want.CatchUp || spec.Calendar.JitterMaxMs != want.JitterMaxMs || spec.Duration != 0 || spec.Interval != 0 {
		t.Fatalf("normalized spec: %+v", spec.Calendar)
	}
	if all, err := timers.DecodeCreateTimer([]byte(`{"cron":"@daily","catchup":"all"}`), timers.TimerLimits{}); err != nil || all.Calendar.CatchUpWindowMs != time.Hour.Milliseconds() || all.Calendar.TZ != "UTC" {
		t.Fatalf("catchup all's default window: %+v %v", all.Calendar, err)
	}
}

// TestCalendarRecordRules: on a real store with a set clock, a calendar
// timer's record: its first fire, its previews, fires and skipped
// occurrences applied, a pause through what would have been fires (not
// caught up), max_fires completing it.
func TestCalendarRecordRules(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC)
	s := timers.NewStore(res.Timers, func() time.Time { return now }, kvrec.Retention{JS: res.JS})
	spec, err := timers.DecodeCreateTimer([]byte(`{"cron":"30 2 * * *","tz":"America/New_York","max_fires":3}`), timers.TimerLimits{})
	if err != nil {
		t.Fatal(err)
	}
	tm, err := s.Create(ctx, "cal", spec)
	if err != nil {
		t.Fatal(err)
	}
	first := time.Date(2026, 3, 8, 7, 0, 0, 0, time.UTC) // 02:30 skipped: 03:00 EDT
	if !tm.Repeat || tm.IntervalMs != nil || !tm.NextFireAt.Equal(first) || tm.Cron != "30 2 * * *" || tm.DSTSkipped != "shift" {
		t.Fatalf("created: %+v", tm)
	}
	pv := timers.Preview(tm, now, 5)
	if len(pv.Fires) != 3 || !pv.Fires[0].ScheduledAt.Equal(first) || !pv.Fires[1].ScheduledAt.Equal(time.Date(2026, 3, 9, 6, 30, 0, 0, time.UTC)) {
		t.Fatalf("preview (max_fires 3): %+v", pv)
	}

	// Fire 1, then a skipped occurrence: the count stays, next moves.
	next := first.Add(23*time.Hour + 30*time.Minute)
	apply := func(f timers.TimerFired) {
		t.Helper()
		if ok, err := s.ApplyFire(ctx, &f); err != nil || !ok {
			t.Fatalf("apply %+v: %v %v", f, ok, err)
		}
	}
	apply(timers.TimerFired{AgentID: "cal", TimerID: tm.ID, Occurrence: 1, DueAt: first, FiredAt: first, NextDue: &next, Calendar: true})
	later := next.Add(24 * time.Hour)
	apply(timers.TimerFired{AgentID: "cal", TimerID: tm.ID, Occurrence: 2, DueAt: next, FiredAt: later, NextDue: &later, Calendar: true, Skipped: true})
	got := mustGetAgent(ctx, t, s, "cal", tm.ID)
	if got.FireCount != 1 || !got.NextFireAt.Equal(later) {
		t.Fatalf("after a skip: %+v", got)
	}
	// An occurrence before next_fire_at is superseded.
	if ok, err := s.ApplyFire(ctx, &timers.TimerFired{AgentID: "cal", TimerID: tm.ID, Occurrence: 2, DueAt: next, FiredAt: next, NextDue: &later, Calendar: true}); ok || err != nil {
		t.Fatalf("superseded occurrence applied: %v %v", ok, err)
	}

	// Paused with a note through two of its times: resumed, the next
	// time after now, nothing caught up.
	p, err := s.PauseNoted(ctx, "cal", tm.ID, "maintenance")
	if err != nil || p.Note != "maintenance" || p.Status != timers.TimerPaused {
		t.Fatalf("pause: %+v %v", p, err)
	}
	now = later.Add(36 * time.Hour)
	r, err := s.ResumeNoted(ctx, "cal", tm.ID, "back")
	if err != nil || r.Status != timers.TimerActive || r.Note != "back" || !r.NextFireAt.After(now) || r.NextFireAt.Sub(now) > 24*time.Hour || r.FireCount != 1 {
		t.Fatalf("resume: %+v %v", r, err)
	}

	// Fires 2 and 3: max_fires reached, the timer completes.
	d2 := *r.NextFireAt
	d3 := d2.Add(24 * time.Hour)
	apply(timers.TimerFired{AgentID: "cal", TimerID: tm.ID, Occurrence: 2, DueAt: d2, FiredAt: d2, NextDue: &d3, Calendar: true})
	apply(timers.TimerFired{AgentID: "cal", TimerID: tm.ID, Occurrence: 3, DueAt: d3, FiredAt: d3, Calendar: true})
	if got := mustGetAgent(ctx, t, s, "cal", tm.ID); got.Status != timers.TimerCompleted || got.FireCount != 3 || got.NextFireAt != nil {
		t.Fatalf("after max_fires: %+v", got)
	}

	// A schedule with no time before its end is refused at create.
	spec, err = timers.DecodeCreateTimer([]byte(`{"cron":"0 9 * * *","start_at":"2026-03-07T12:00:00Z","end_at":"2026-03-07T13:00:00Z"}`), timers.TimerLimits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "cal", spec); err == nil || !strings.Contains(err.Error(), "has no fire between") {
		t.Fatalf("empty schedule: %v", err)
	}
}

func mustGetAgent(ctx context.Context, t *testing.T, s *timers.Store, agent, id string) *timers.Timer {
	t.Helper()
	got, err := s.Get(ctx, agent, id)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestCalendarOnEverySurface: a calendar timer made over NATS fires on a
// real replica, each envelope named by its scheduled time and saying it;
// timer.next answers on NATS and HTTP.
func TestCalendarOnEverySurface(t *testing.T) {
	r := startReplica(t)
	nc, err := nats.Connect(r.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(nc, "ca")
	if err != nil {
		t.Fatal(err)
	}
	var tm timers.Timer
	if err := c.Request(ctx, subjects.ActionTimerCreate, []byte(`{"cron":"* * * * * *","tz":"Australia/Lord_Howe","summary":"tick"}`), &tm); err != nil || tm.Cron == "" {
		t.Fatalf("create over NATS: %+v %v", tm, err)
	}
	var next timers.NextTimerReply
	if err := c.Request(ctx, timers.ActionTimerNext, []byte(`{"timer_id":"`+tm.ID+`","count":3}`), &next); err != nil || len(next.Fires) != 3 ||
		next.Fires[1].ScheduledAt.Sub(next.Fires[0].ScheduledAt) != time.Second {
		t.Fatalf("timer.next over NATS: %+v %v", next, err)
	}
	resp, err := http.Get("http://" + r.HTTPAddr() + "/api/agents/ca/timers/" + tm.ID + "/next?count=2")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &next) != nil || len(next.Fires) != 2 {
		t.Fatalf("timer.next over HTTP: %d %s", resp.StatusCode, body)
	}
	seen := map[string]bool{}
	for len(seen) < 3 {
		got, err := c.FetchInbox(ctx, 10, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range got.Deliveries {
			var env subjects.Envelope
			if err := json.Unmarshal(d.Envelope, &env); err != nil {
				t.Fatal(err)
			}
			var data timers.TimerFiredData
			if err := json.Unmarshal(env.Data, &data); err != nil || data.ScheduledAt == nil || !data.ScheduledAt.Equal(data.DueAt) {
				t.Fatalf("fire data: %s %v", env.Data, err)
			}
			if want := "timer_" + tm.ID + "_at_" + data.ScheduledAt.UTC().Format("20060102T150405Z"); env.ID != want || seen[env.ID] {
				t.Fatalf("envelope %s (want %s, once)", env.ID, want)
			}
			seen[env.ID] = true
			if _, err := c.AckInbox(ctx, d.Seq); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestPreviewIntervalTimers: timer.next for the interval forms: a
// repeating timer's cadence, a one-shot's one fire, a paused repeating
// timer's cadence after now, nothing for a finished one.
func TestPreviewIntervalTimers(t *testing.T) {
	now := time.Date(2026, 6, 1, 9, 0, 0, 0, time.UTC)
	next := now.Add(time.Minute)
	iv := int64(30_000)
	rep := &timers.Timer{ID: "r", Status: timers.TimerActive, Repeat: true, IntervalMs: &iv, NextFireAt: &next}
	if p := timers.Preview(rep, now, 3); len(p.Fires) != 3 || !p.Fires[2].ScheduledAt.Equal(next.Add(time.Minute)) {
		t.Fatalf("repeating: %+v", p)
	}
	once := &timers.Timer{ID: "o", Status: timers.TimerActive, NextFireAt: &next}
	if p := timers.Preview(once, now, 3); len(p.Fires) != 1 || !p.Fires[0].FireAt.Equal(next) {
		t.Fatalf("one-shot: %+v", p)
	}
	paused := *rep
	paused.Status = timers.TimerPaused
	if p := timers.Preview(&paused, next.Add(45*time.Second), 1); len(p.Fires) != 1 || !p.Fires[0].ScheduledAt.Equal(next.Add(time.Minute)) {
		t.Fatalf("paused past two ticks: %+v", p)
	}
	done := &timers.Timer{ID: "d", Status: timers.TimerCompleted}
	if p := timers.Preview(done, now, 3); len(p.Fires) != 0 || p.Status != "completed" {
		t.Fatalf("completed: %+v", p)
	}
}
