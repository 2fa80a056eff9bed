package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waits"
)

func TestDurationWaitCompletes(t *testing.T) {
	_, nc := startChime(t)
	c, _ := client.New(nc, "waiter")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var progress []waits.WaitProgress
	var reply waits.WaitReply
	all := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(subjects.Agent("waiter", waits.ActionWaitProgress), all)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	start := time.Now()
	res, err := c.Wait(ctx, client.WaitRequest{
		Seconds: 2,
		Started: func(r waits.WaitReply) { reply = r },
		Progress: func(p waits.WaitProgress) {
			progress = append(progress, p)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if reply.Mode != waits.WaitDuration || !strings.HasSuffix(reply.TargetTime, "+00:00") {
		t.Errorf("reply %+v", reply)
	}
	if want := "Wait complete. Reached " + reply.TargetTime + "."; res.Text != want || res.TargetTime != reply.TargetTime {
		t.Errorf("text %q, want %q", res.Text, want)
	}
	target, _ := time.Parse(time.RFC3339Nano, reply.TargetTime)
	if time.Now().Before(target) || took < 2*time.Second {
		t.Errorf("completed %v after the request, before its target", took)
	}
	if len(progress) < 1 {
		t.Fatal("no progress in a 2 s wait")
	}
	p := progress[0]
	if p.WaitID != reply.WaitID || p.Heading != "icon://timer Wait: "+p.Remaining || p.Remaining != waits.RemainingText(p.RemainingSeconds) ||
		p.RemainingSeconds <= 0 || p.RemainingSeconds > 2 {
		t.Errorf("progress %+v", p)
	}
	// The progress ends with Agent Zero's final heading, after the end.
	for done := false; !done; {
		select {
		case m := <-all:
			var p waits.WaitProgress
			if err := json.Unmarshal(m.Data, &p); err != nil {
				t.Fatal(err)
			}
			done = p.Done && p.WaitID == reply.WaitID && p.Heading == "icon://timer Wait: Done icon://done_all" && p.RemainingSeconds == 0
		case <-ctx.Done():
			t.Fatal("no final progress")
		}
	}
	t.Logf("completed after %v with %d progress messages", took.Round(time.Millisecond), len(progress))
}

func TestUntilWaitInNamedZone(t *testing.T) {
	_, nc := startChime(t)
	c, _ := client.New(nc, "waiter")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tokyo, _ := time.LoadLocation("Asia/Tokyo")
	target := time.Now().Add(2 * time.Second).Truncate(time.Second).Add(time.Second)
	naive := target.In(tokyo).Format("2006-01-02 15:04:05")
	var reply waits.WaitReply
	res, err := c.Wait(ctx, client.WaitRequest{Until: naive, TZ: "Asia/Tokyo", Started: func(r waits.WaitReply) { reply = r }})
	if err != nil {
		t.Fatal(err)
	}
	want := target.In(tokyo).Format("2006-01-02T15:04:05") + "+09:00"
	if reply.Mode != waits.WaitUntil || reply.TargetTime != want || res.Text != "Wait complete. Reached "+want+"." {
		t.Errorf("reply %+v, result %+v, want target %s", reply, res, want)
	}
	if time.Now().Before(target) {
		t.Error("completed before its target")
	}
}

func TestInterventionCancelsWaits(t *testing.T) {
	_, nc := startChime(t)
	c, _ := client.New(nc, "busy")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	inbox := make(chan *nats.Msg, 16)
	sub, _ := nc.ChanSubscribe(subjects.Inbox("busy"), inbox)
	defer func() { _ = sub.Unsubscribe() }()

	errs := make(chan error, 2)
	var started atomic.Int32
	for range 2 {
		go func() {
			_, err := c.Wait(ctx, client.WaitRequest{Minutes: 10, Started: func(waits.WaitReply) { started.Add(1) }})
			errs <- err
		}()
	}
	testwait.Eventually(t, 10*time.Second, func() bool { return started.Load() == 2 }, "both waits started")
	sent := time.Now()
	if err := c.Intervene(ctx, interventions.ActionMessage, "the operator needs you now"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		err := <-errs
		var iv *client.InterventionError
		if !errors.Is(err, client.ErrIntervention) || !errors.As(err, &iv) || iv.Text != "the operator needs you now" {
			t.Fatalf("wait ended with %v", err)
		}
	}
	t.Logf("both waits cancelled %v after the intervention was sent", time.Since(sent).Round(time.Microsecond))

	kinds := map[string]subjects.Envelope{}
	for len(kinds) < 2 {
		select {
		case m := <-inbox:
			var env subjects.Envelope
			_ = json.Unmarshal(m.Data, &env)
			kinds[env.Kind] = env
		case <-ctx.Done():
			t.Fatalf("inbox got %v", kinds)
		}
	}
	if iv := kinds[subjects.KindIntervention]; iv.Trust != subjects.TrustOperator || iv.Text != "the operator needs you now" {
		t.Errorf("intervention delivery %+v", iv)
	}
	if wc := kinds[subjects.KindWaitCancelled]; wc.Text != "the operator needs you now" || wc.Trust != subjects.TrustSystem {
		t.Errorf("wait_cancelled delivery %+v", wc)
	}
}

func TestPauseMovesDurationWaitsOnly(t *testing.T) {
	_, nc := startChime(t)
	c, _ := client.New(nc, "pausable")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type outcome struct {
		reply waits.WaitReply
		res   *client.WaitResult
		err   error
		at    time.Time
	}
	run := func(req client.WaitRequest) chan outcome {
		ch := make(chan outcome, 1)
		started := make(chan waits.WaitReply, 1)
		req.Started = func(r waits.WaitReply) { started <- r }
		go func() {
			res, err := c.Wait(ctx, req)
			r := <-started
			ch <- outcome{r, res, err, time.Now()}
		}()
		return ch
	}
	begin := time.Now()
	dur := run(client.WaitRequest{Seconds: 4})
	until := run(client.WaitRequest{Until: begin.Add(4 * time.Second).UTC().Format(time.RFC3339Nano)})
	time.Sleep(500 * time.Millisecond)
	if err := c.Intervene(ctx, interventions.ActionPause, ""); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if err := c.Intervene(ctx, interventions.ActionResume, ""); err != nil {
		t.Fatal(err)
	}
	u := <-until
	if u.err != nil || u.res.TargetTime != u.reply.TargetTime {
		t.Fatalf("until wait: %+v", u)
	}
	d := <-dur
	if d.err != nil {
		t.Fatal(d.err)
	}
	orig, _ := time.Parse(time.RFC3339Nano, d.reply.TargetTime)
	moved, _ := time.Parse(time.RFC3339Nano, d.res.TargetTime)
	if shift := moved.Sub(orig); shift < 2500*time.Millisecond || shift > 4*time.Second {
		t.Errorf("duration wait moved by %v, want about 3s", shift)
	}
	if d.res.Text != "Wait complete. Reached "+d.res.TargetTime+"." {
		t.Errorf("text %q", d.res.Text)
	}
	if !d.at.After(u.at) {
		t.Error("the duration wait finished before the until wait")
	}
	t.Logf("until wait done at +%v, duration wait at +%v (target moved %v)",
		u.at.Sub(begin).Round(time.Millisecond), d.at.Sub(begin).Round(time.Millisecond), moved.Sub(orig).Round(time.Millisecond))
}

func TestWaitBadInput(t *testing.T) {
	_, nc := startChime(t)
	for _, tc := range []struct{ subject, body, code, msg string }{
		{"agent.w.wait.request", `{"seconds":0}`, waits.CodeInvalidDuration, "Wait duration must be positive."},
		{"agent.w.wait.request", `{}`, waits.CodeInvalidDuration, "Wait duration must be positive."},
		{"agent.w.wait.request", `{"until":"next week"}`, waits.CodeInvalidTimestamp, "Invalid timestamp format: next week"},
		{"agent.w.wait.request", `{"until":"2020-01-01T00:00:00Z"}`, waits.CodeTargetInPast, "Target time 2020-01-01T00:00:00+00:00 is in the past."},
		{"agent.w.wait.request", `{"until":"2099-01-01","tz":"Nowhere/Land"}`, waits.CodeInvalidTimezone, "Unknown time zone: Nowhere/Land"},
		{"agent.w.wait.request", `{"seconds":5,"reason":"x"}`, subjects.CodeInvalidRequest, `unknown field "reason"`},
		{"agent.w.wait.request", `{"seconds":`, subjects.CodeInvalidJSON, ""},
		{"agent.w.wait.cancel", `{"wait_id":"nope"}`, waits.CodeWaitNotFound, "wait nope not found"},
		{"agent.w.wait.cancel", `{"wait_id":"a.b"}`, subjects.CodeInvalidID, ""},
		{"agent.w.intervention", `{"action":"explode"}`, subjects.CodeInvalidRequest, `unknown action "explode": message, pause, resume or stop`},
		{"agent.w.intervention", `{"action":"message"}`, subjects.CodeInvalidRequest, "text is required for action message"},
	} {
		msg := request(t, nc, tc.subject, tc.body)
		var reply subjects.ErrorReply
		if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.Error == nil || reply.Error.Code != tc.code || (tc.msg != "" && reply.Error.Message != tc.msg) {
			t.Errorf("%s %s: %s, want %s %q", tc.subject, tc.body, msg.Data, tc.code, tc.msg)
		}
	}
	// A chosen ID is used once; the second request is refused, the first kept.
	c, _ := client.New(nc, "w")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var first waits.WaitReply
	if err := c.Request(ctx, waits.ActionWaitRequest, []byte(`{"minutes":5,"id":"mine"}`), &first); err != nil || first.WaitID != "mine" {
		t.Fatalf("first: %+v %v", first, err)
	}
	err := c.Request(ctx, waits.ActionWaitRequest, []byte(`{"seconds":1,"id":"mine"}`), &first)
	if !errors.Is(err, waits.ErrWaitExists) {
		t.Fatalf("second with the same id: %v", err)
	}
	w, err := c.CancelWait(ctx, "mine")
	if err != nil || w.Status != waits.WaitCancelled || w.Mode != waits.WaitDuration {
		t.Fatalf("cancel: %+v %v", w, err)
	}
	if again, err := c.CancelWait(ctx, "mine"); err != nil || again.Status != waits.WaitCancelled || !again.EndedAt.Equal(*w.EndedAt) {
		t.Fatalf("cancel twice: %+v %v", again, err)
	}
}
