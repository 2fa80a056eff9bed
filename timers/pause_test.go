package timers_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/access"
	"github.com/chime-nats/chime/api"
	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/replica"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

// TestPauseResumeRules: a paused timer keeps its place and its due time;
// resumed, it fires at that due time when still ahead, a repeating one at
// its cadence's next point after the resume when not; an occurrence on its
// way when the pause came is recorded; finished timers are refused.
func TestPauseResumeRules(t *testing.T) {
	ns := natstest.Server(t)
	_, res := natstest.Provisioned(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	s := timers.NewStore(res.Timers, func() time.Time { return now }, kvrec.Retention{JS: res.JS})

	rep, err := s.Create(ctx, "pz", timers.TimerSpec{Duration: 10 * time.Second, Interval: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	first := *rep.NextFireAt
	for i := range 2 { // the second pause is a no-op
		got, err := s.Pause(ctx, "pz", rep.ID)
		if err != nil || got.Status != timers.TimerPaused || !got.NextFireAt.Equal(first) {
			t.Fatalf("pause %d: %+v %v", i, got, err)
		}
	}
	if due, fires := timers.Due(mustGet(ctx, t, s, rep.ID)); fires {
		t.Fatalf("a paused timer fires at %v", due)
	}

	// Resumed before its due time: due as it was.
	now = now.Add(5 * time.Second)
	got, err := s.Resume(ctx, "pz", rep.ID)
	if err != nil || got.Status != timers.TimerActive || !got.NextFireAt.Equal(first) {
		t.Fatalf("resume before due: %+v %v", got, err)
	}
	if again, err := s.Resume(ctx, "pz", rep.ID); err != nil || !again.NextFireAt.Equal(first) {
		t.Fatalf("resume of an active timer: %+v %v", again, err)
	}

	// Paused over three ticks: resumed, the next point of the cadence
	// after now; the ticks in between are skipped.
	if _, err := s.Pause(ctx, "pz", rep.ID); err != nil {
		t.Fatal(err)
	}
	now = first.Add(25 * time.Second)
	got, err = s.Resume(ctx, "pz", rep.ID)
	if want := first.Add(30 * time.Second); err != nil || !got.NextFireAt.Equal(want) || got.FireCount != 0 {
		t.Fatalf("resume after three ticks: next %v, want %v (%+v, %v)", got.NextFireAt, want, got, err)
	}

	// An occurrence published just before the pause lands after it: it
	// was delivered, so it is recorded, and the timer stays paused.
	if _, err := s.Pause(ctx, "pz", rep.ID); err != nil {
		t.Fatal(err)
	}
	due := *got.NextFireAt
	if applied, err := s.ApplyFire(ctx, &timers.TimerFired{AgentID: "pz", TimerID: rep.ID, Occurrence: 1, DueAt: due, FiredAt: due}); err != nil || !applied {
		t.Fatalf("apply on a paused timer: %v %v", applied, err)
	}
	if got := mustGet(ctx, t, s, rep.ID); got.FireCount != 1 || got.Status != timers.TimerPaused || !got.NextFireAt.Equal(due.Add(10*time.Second)) {
		t.Fatalf("after the fire: %+v", got)
	}

	// A one-shot paused past its due time fires at once when resumed.
	once, err := s.Create(ctx, "pz", timers.TimerSpec{Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pause(ctx, "pz", once.ID); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Minute)
	if got, err := s.Resume(ctx, "pz", once.ID); err != nil || !got.NextFireAt.Equal(*once.NextFireAt) || got.NextFireAt.After(now) {
		t.Fatalf("resume of an overdue one-shot: %+v %v", got, err)
	}

	// Finished timers are refused, each with its own code.
	if _, err := s.Cancel(ctx, "pz", rep.ID); err != nil {
		t.Fatal(err)
	}
	for _, do := range []func(context.Context, string, string) (*timers.Timer, error){s.Pause, s.Resume} {
		_, err := do(ctx, "pz", rep.ID)
		var e *subjects.Error
		if !errors.As(err, &e) || e.Code != timers.CodeTimerCancelled || e.Status != http.StatusConflict || !strings.Contains(e.Message, rep.ID) {
			t.Fatalf("cancelled timer: %v", err)
		}
	}
	if _, err := s.ApplyFire(ctx, &timers.TimerFired{AgentID: "pz", TimerID: once.ID, Occurrence: 1, DueAt: *once.NextFireAt, FiredAt: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pause(ctx, "pz", once.ID); !errors.Is(err, subjects.ErrTimerCompleted) {
		t.Fatalf("completed timer: %v", err)
	}
	if _, err := s.Pause(ctx, "other", once.ID); !errors.Is(err, subjects.ErrTimerNotFound) {
		t.Fatalf("another agent's timer: %v", err)
	}
}

func mustGet(ctx context.Context, t *testing.T, s *timers.Store, id string) *timers.Timer {
	t.Helper()
	got, err := s.Get(ctx, "pz", id)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestPauseOnEverySurface: timer.pause and timer.resume, declared only in
// this package, are served on NATS and HTTP, granted to agents by the
// callout's rights, and stop and restart a real replica's firing.
func TestPauseOnEverySurface(t *testing.T) {
	rights := api.Rights()
	for _, name := range []string{timers.ActionTimerPause, timers.ActionTimerResume} {
		if !slices.Contains(rights.Agent, name) {
			t.Errorf("the callout does not grant agents %s: %v", name, rights.Agent)
		}
	}
	agent := access.Principal{Kind: access.KindAgent, AgentID: "pa"}.Permissions(rights)
	if !slices.Contains(agent.Pub.Allow, "agent.pa.timer.pause") || !slices.Contains(agent.Pub.Allow, "agent.pa.timer.resume") {
		t.Errorf("an agent may not publish its own timer.pause and timer.resume: %v", agent.Pub.Allow)
	}

	r := startReplica(t)
	nc, err := nats.Connect(r.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(nc, "pa")
	if err != nil {
		t.Fatal(err)
	}
	tm, err := c.CreateTimer(ctx, 500, 0, "paused one-shot")
	if err != nil {
		t.Fatal(err)
	}
	var paused timers.Timer
	if err := c.Request(ctx, timers.ActionTimerPause, []byte(`{"timer_id":"`+tm.ID+`"}`), &paused); err != nil || paused.Status != timers.TimerPaused {
		t.Fatalf("pause over NATS: %+v %v", paused, err)
	}
	// Past its due time, paused: nothing in the inbox. (A real replica
	// must be given the time to fire it, were it going to.)
	time.Sleep(1500 * time.Millisecond)
	if got, err := c.FetchInbox(ctx, 10, 200*time.Millisecond); err != nil || len(got.Deliveries) != 0 {
		t.Fatalf("a paused timer fired: %+v %v", got, err)
	}

	resp, err := http.Post("http://"+r.HTTPAddr()+"/api/control/agents/pa/timers/"+tm.ID+"/resume", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var resumed timers.Timer
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &resumed) != nil || resumed.Status != timers.TimerActive {
		t.Fatalf("resume over HTTP: %d %s", resp.StatusCode, body)
	}
	got, err := c.FetchInbox(ctx, 10, 5*time.Second)
	if err == nil && len(got.Deliveries) == 0 { // the long poll ended first
		got, err = c.FetchInbox(ctx, 10, 5*time.Second)
	}
	if err != nil || len(got.Deliveries) != 1 || !strings.Contains(string(got.Deliveries[0].Envelope), `"kind":"`+subjects.KindTimerFired+`"`) {
		t.Fatalf("the resumed overdue one-shot did not fire once at once: %+v %v", got, err)
	}

	// The fire is in the inbox before its record says so (the record is
	// written after the publish is acknowledged, and a pause in between is
	// overwritten by the fire): wait for the record to complete.
	for {
		var got timers.Timer
		if err := c.Request(ctx, subjects.ActionTimerGet, []byte(`{"timer_id":"`+tm.ID+`"}`), &got); err != nil {
			t.Fatal(err)
		}
		if got.Status == timers.TimerCompleted {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the fired one-shot never recorded completed: %+v", got)
		case <-time.After(20 * time.Millisecond):
		}
	}
	resp, err = http.Post("http://"+r.HTTPAddr()+"/api/control/agents/pa/timers/"+tm.ID+"/pause", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), `"timer_completed"`) {
		t.Fatalf("pause of a completed timer over HTTP: %d %s", resp.StatusCode, body)
	}
}

// startReplica runs a whole replica in-process on an embedded server.
func startReplica(t *testing.T) *replica.Replica {
	t.Helper()
	cfg := &config.Config{
		DataDir: t.TempDir(), NATSListen: "127.0.0.1:-1", JSReplicas: 1, HTTPAddr: "127.0.0.1:0",
		ReplicaID: "pause", Shards: 8, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour,
		LogLevel: "info", LogFormat: "text",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := replica.Start(ctx, cfg, slog.New(slog.DiscardHandler), "0.0.0-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop(context.Background()) })
	return r
}
