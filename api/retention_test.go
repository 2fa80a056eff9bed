package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/callbacks"
	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/testlog"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waits"
)

// gauge reads one unlabelled gauge from the replica's /metrics.
func gauge(t *testing.T, base, name string) string {
	t.Helper()
	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no %s in /metrics", name)
	}
	return string(m[1])
}

// TestFinishedRecordsExpire runs a replica with a 2 s record retention:
// finished timers (fired, cancelled), ended waits (completed, cancelled)
// and revoked triggers are gone from lists and gets a little after it;
// active ones stay and keep working: the scheduler's index still holds and
// fires them, callbacks with live tokens are still taken.
func TestFinishedRecordsExpire(t *testing.T) {
	logs := &testlog.Buffer{}
	r, nc := startChimeWith(t, logs, func(c *config.Config) { c.RecordRetention = 2 * time.Second })
	base := "http://" + r.HTTPAddr()
	ctx := context.Background()
	c, _ := client.New(nc, "ret")
	inbox := inboxOf(t, nc, "ret")
	create := func(ms, every int64, summary string) *timers.Timer {
		t.Helper()
		tm, err := c.CreateTimer(ctx, ms, every, summary)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	fires := create(50, 0, "fires")
	cancelled := create(60000, 0, "cancelled")
	if _, err := c.CancelTimer(ctx, cancelled.ID); err != nil {
		t.Fatal(err)
	}
	active := create(600000, 0, "active")
	repeating := create(1000, 1000, "tick")
	late := create(5000, 0, "late") // due after the finished ones are gone
	for _, body := range []string{`{"seconds":1,"id":"w-done"}`, `{"seconds":600,"id":"w-cancel"}`, `{"seconds":600,"id":"w-wait"}`} {
		if msg := request(t, nc, "agent.ret.wait.request", body); strings.Contains(string(msg.Data), `"error"`) {
			t.Fatalf("%s: %s", body, msg.Data)
		}
	}
	if _, err := c.CancelWait(ctx, "w-cancel"); err != nil {
		t.Fatal(err)
	}
	urls := startAgent(t, nc, "ret")
	extra, err := c.CreateTrigger(ctx, callbacks.ModeEnqueueMessage, "extra")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CancelTrigger(ctx, extra.ID); err != nil {
		t.Fatal(err)
	}
	reset, err := c.ResetCallback(ctx, callbacks.ModeWakeHint) // revokes the first wake default
	if err != nil {
		t.Fatal(err)
	}
	if all, _ := c.ListTriggers(ctx); len(all) != 4 {
		t.Fatalf("%d triggers before expiry, want 2 live and 2 revoked", len(all))
	}
	testwait.Eventually(t, 5*time.Second, func() bool {
		got, err := c.GetTimer(ctx, fires.ID)
		return err == nil && got.Status == timers.TimerCompleted
	}, "one-shot fired")

	timerIDs := func() []string {
		list, err := c.ListTimers(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, tm := range list {
			ids = append(ids, tm.ID)
		}
		slices.Sort(ids)
		return ids
	}
	want := []string{active.ID, repeating.ID, late.ID}
	slices.Sort(want)
	testwait.Eventually(t, 10*time.Second, func() bool { return slices.Equal(timerIDs(), want) }, "finished timers gone from the list")
	for _, id := range []string{fires.ID, cancelled.ID} {
		if _, err := c.GetTimer(ctx, id); !errors.Is(err, subjects.ErrTimerNotFound) {
			t.Errorf("get %s after expiry: %v", id, err)
		}
	}
	testwait.Eventually(t, 10*time.Second, func() bool {
		_, err := c.CancelWait(ctx, "w-done")
		return errors.Is(err, waits.ErrWaitNotFound)
	}, "ended waits gone")
	if _, err := c.CancelWait(ctx, "w-cancel"); !errors.Is(err, waits.ErrWaitNotFound) {
		t.Errorf("cancel of an expired cancelled wait: %v", err)
	}
	testwait.Eventually(t, 10*time.Second, func() bool {
		all, err := c.ListTriggers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, tr := range all {
			if tr.Status != callbacks.TriggerActive {
				return false
			}
		}
		return len(all) == 2
	}, "revoked triggers gone")
	var http200 struct {
		Timers []timers.Timer `json:"timers"`
	}
	res, err := http.Get(base + "/api/agents/ret/timers")
	if err != nil {
		t.Fatal(err)
	}
	_ = json.NewDecoder(res.Body).Decode(&http200)
	res.Body.Close()
	if len(http200.Timers) != 3 {
		t.Errorf("HTTP list after expiry: %+v", http200.Timers)
	}

	// What is live is untouched, in storage and in the scheduler's index.
	if got := gauge(t, base, "chime_timers_active"); got != "3" {
		t.Errorf("index holds %s timers, want 3", got)
	}
	if got := gauge(t, base, "chime_waits_active"); got != "1" {
		t.Errorf("index holds %s waits, want 1", got)
	}
	if _, err := c.CancelWait(ctx, "w-wait"); err != nil { // still there to cancel
		t.Errorf("the waiting wait: %v", err)
	}
	seen := map[string]bool{}
	testwait.Eventually(t, 10*time.Second, func() bool {
		select {
		case env := <-inbox:
			if env.Kind == subjects.KindTimerFired {
				seen[env.Source.ID] = true
			}
		default:
		}
		return seen[late.ID] && seen[repeating.ID]
	}, "the late timer and the repeating one fire after the expiry")
	status, body := post(t, reset.TriggerURL, "", nil)
	accepted(t, status, body, "ret", callbacks.ModeWakeHint, "triggered")
	status, body = post(t, urls[callbacks.ModeEnqueueMessage], "text/plain", []byte("still here"))
	accepted(t, status, body, "ret", callbacks.ModeEnqueueMessage, "enqueued")
	rejectedAt(t, "the expired default", urls[callbacks.ModeWakeHint])
	if strings.Contains(logs.String(), "undecodable") {
		t.Errorf("an expiry marker was read as a record:\n%s", logs.String())
	}
}

// TestRetentionZeroKeepsRecords: with CHIME_RECORD_RETENTION=0 nothing
// expires, as before: the cancelled timer moves to CHIME_HISTORY, which
// then has no maximum age, and a get still finds it there.
func TestRetentionZeroKeepsRecords(t *testing.T) {
	_, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.RecordRetention = 0 })
	c, _ := client.New(nc, "keep")
	ctx := context.Background()
	tm, err := c.CreateTimer(ctx, 60000, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CancelTimer(ctx, tm.ID); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, engine.HistoryStream)
	if err != nil {
		t.Fatal(err)
	}
	if s.CachedInfo().Config.MaxAge != 0 {
		t.Fatalf("history kept for %v with retention 0", s.CachedInfo().Config.MaxAge)
	}
	testwait.Eventually(t, 5*time.Second, func() bool {
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 1
	}, "the cancelled timer in the history")
	if got, err := c.GetTimer(ctx, tm.ID); err != nil || got.Status != timers.TimerCancelled {
		t.Fatalf("cancelled timer with retention 0: %+v %v", got, err)
	}
}
