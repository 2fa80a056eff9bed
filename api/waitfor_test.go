package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/interventions"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/questions"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/waitfor"
)

// wfInbox collects an agent's inbox envelopes.
func wfInbox(t *testing.T, nc *nats.Conn, agentID string) chan subjects.Envelope {
	t.Helper()
	ch := make(chan subjects.Envelope, 64)
	sub, err := nc.Subscribe(subjects.Inbox(agentID), func(m *nats.Msg) {
		var env subjects.Envelope
		if json.Unmarshal(m.Data, &env) == nil {
			ch <- env
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return ch
}

// woken waits for the wait_woken of waitID and checks that it names the
// registration and what woke it; then, that no second one follows within
// quiet (a check of absence, not of speed).
func woken(t *testing.T, inbox chan subjects.Envelope, waitID, byKind string, quiet time.Duration) waitfor.WaitWokenData {
	t.Helper()
	var got *waitfor.WaitWokenData
	deadline := time.After(15 * time.Second)
	for got == nil {
		select {
		case env := <-inbox:
			if env.Kind != subjects.KindWaitWoken {
				continue
			}
			var d waitfor.WaitWokenData
			if err := json.Unmarshal(env.Data, &d); err != nil || d.WaitID != waitID || env.ID != "wait_woken_"+waitID {
				t.Fatalf("wait_woken %+v (%v), want %s", env, err, waitID)
			}
			if d.WokenBy.Kind != byKind {
				t.Fatalf("woken by %+v, want %s", d.WokenBy, byKind)
			}
			got = &d
		case <-deadline:
			t.Fatalf("no wait_woken for %s", waitID)
		}
	}
	end := time.After(quiet)
	for {
		select {
		case env := <-inbox:
			if env.Kind == subjects.KindWaitWoken {
				t.Fatalf("a second wait_woken: %+v", env)
			}
		case <-end:
			return *got
		}
	}
}

func registerWaitFor(t *testing.T, c *client.Client, wake, resource, delivery string) *waitfor.WaitForReply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.WaitFor(ctx, waitfor.WaitForRequest{Wake: wake, Resource: resource, Reason: "waiting on " + wake, Delivery: delivery})
	if err != nil {
		t.Fatalf("WaitFor %s: %v", wake, err)
	}
	return r
}

func wantCode(t *testing.T, err error, code, msg string) {
	t.Helper()
	var e *subjects.Error
	if !errors.As(err, &e) || e.Code != code || e.Message != msg {
		t.Fatalf("got %v, want %s: %s", err, code, msg)
	}
}

func TestWaitForWakes(t *testing.T) {
	_, nc := startChime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, _ := client.New(nc, "wf")
	inbox := wfInbox(t, nc, "wf")

	t.Run("timer", func(t *testing.T) {
		tm, err := c.CreateTimer(ctx, 500, 0, "")
		if err != nil {
			t.Fatal(err)
		}
		other, _ := client.New(nc, "wf-other")
		_, err = other.WaitFor(ctx, waitfor.WaitForRequest{Wake: "timer", Resource: tm.ID, Reason: "r", Delivery: "silent"})
		wantCode(t, err, "timer_agent_mismatch", "wait_for timer agent mismatch: "+tm.ID)
		r := registerWaitFor(t, c, "timer", tm.ID, "silent")
		if r.Continuation != waitfor.YieldAndWait || r.Disposition != "registered" || !r.WaitRegistered || r.Scope != "agent" {
			t.Fatalf("reply %+v", r)
		}
		d := woken(t, inbox, r.WaitID, subjects.KindTimerFired, time.Second)
		if d.Resource != tm.ID || d.WokenBy.Source.ID != tm.ID {
			t.Fatalf("woken %+v", d)
		}
		// Now completed: Holon's texts for a bad timer resource.
		_, err = c.WaitFor(ctx, waitfor.WaitForRequest{Wake: "timer", Resource: tm.ID, Reason: "r", Delivery: "silent"})
		wantCode(t, err, "timer_not_active", "wait_for timer is not active: "+tm.ID)
		_, err = c.WaitFor(ctx, waitfor.WaitForRequest{Wake: "timer", Resource: "nope", Reason: "r", Delivery: "silent"})
		wantCode(t, err, subjects.CodeTimerNotFound, "wait_for timer does not exist: nope")
		// Once it has left its bucket for CHIME_HISTORY, another agent's
		// finished timer is not found: the history is read by agent, not
		// searched across agents (see the contract's timers section).
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(ctx, engine.TimersBucket)
		if err != nil {
			t.Fatal(err)
		}
		testwait.Eventually(t, 5*time.Second, func() bool {
			_, err := kv.Get(ctx, subjects.TimerKey("wf", tm.ID))
			return errors.Is(err, jetstream.ErrKeyNotFound)
		}, "the completed timer in the history")
		_, err = other.WaitFor(ctx, waitfor.WaitForRequest{Wake: "timer", Resource: tm.ID, Reason: "r", Delivery: "silent"})
		wantCode(t, err, subjects.CodeTimerNotFound, "wait_for timer does not exist: "+tm.ID)
		_, err = c.WaitFor(ctx, waitfor.WaitForRequest{Wake: "timer", Resource: tm.ID, Reason: "r", Delivery: "silent"})
		wantCode(t, err, "timer_not_active", "wait_for timer is not active: "+tm.ID)
	})
	t.Run("system", func(t *testing.T) {
		r := registerWaitFor(t, c, "system", "", "silent")
		if err := request(t, nc, subjects.Agent("wf", waitfor.ActionSystemWake), `{"text":"go"}`).Header.Get("Nats-Service-Error"); err != "" {
			t.Fatal(err)
		}
		woken(t, inbox, r.WaitID, subjects.KindSystemWake, time.Second)
	})
	t.Run("operator_input", func(t *testing.T) {
		r := registerWaitFor(t, c, "operator_input", "", "silent")
		if err := c.Intervene(ctx, interventions.ActionMessage, "here you go"); err != nil {
			t.Fatal(err)
		}
		woken(t, inbox, r.WaitID, subjects.KindIntervention, time.Second)
	})
	t.Run("operator_input by an answer", func(t *testing.T) {
		asked, err := c.Ask(ctx, questions.QuestionItem{Title: "ship it?", Options: []string{"yes", "no"}})
		if err != nil {
			t.Fatal(err)
		}
		r := registerWaitFor(t, c, "operator_input", "", "silent")
		if _, err := c.Answer(ctx, asked.QuestionID, "yes"); err != nil {
			t.Fatal(err)
		}
		d := woken(t, inbox, r.WaitID, subjects.KindAnswer, time.Second)
		if d.WokenBy.Source.ID != asked.QuestionID {
			t.Fatalf("woken %+v", d)
		}
	})
	t.Run("task_result", func(t *testing.T) {
		task, err := c.StartTask(ctx, "wf-build", "make test")
		if err != nil {
			t.Fatal(err)
		}
		r := registerWaitFor(t, c, "task_result", task.ID, "silent")
		if r.Continuation != waitfor.YieldAndWait {
			t.Fatalf("running task: %+v", r)
		}
		out := "ok"
		if _, err := c.ReportResult(ctx, tasks.TaskResultRequest{TaskID: task.ID, Status: tasks.TaskCompleted, Output: &out}); err != nil {
			t.Fatal(err)
		}
		d := woken(t, inbox, r.WaitID, subjects.KindTaskResult, time.Second)
		if d.Resource != task.ID || d.WokenBy.EnvelopeID != tasks.TaskEnvelopeID(task.ID) {
			t.Fatalf("woken %+v", d)
		}
		// Its result is in the inbox now, not consumed: a new WaitFor
		// registers no wait; the queued result is what re-enters, with no
		// wait_woken after it (Holon's task_result_queued), whatever the
		// delivery.
		for _, delivery := range []string{"silent", "final"} {
			again := registerWaitFor(t, c, "task_result", task.ID, delivery)
			if again.Continuation != waitfor.YieldAndReenter || again.Disposition != waitfor.DispositionTaskResultQueued ||
				again.WaitRegistered || again.TaskID != task.ID || again.ResultMessageID != tasks.TaskEnvelopeID(task.ID) {
				t.Fatalf("finished task, %s: %+v", delivery, again)
			}
		}
		quietInbox(t, inbox, time.Second)
		// Once the agent has acked it, the result will not come again:
		// Holon's task_result_already_consumed, nothing registered.
		consumeUpTo(t, c, tasks.TaskEnvelopeID(task.ID))
		before := waitForIDs(t, nc, "wf")
		for _, delivery := range []string{"silent", "final"} {
			done := registerWaitFor(t, c, "task_result", task.ID, delivery)
			if done.Continuation != waitfor.ContinueTurn || done.Disposition != waitfor.DispositionTaskResultAlreadyConsumed ||
				done.WaitRegistered || done.WaitID != "" || done.TaskID != task.ID || done.ResultMessageID != tasks.TaskEnvelopeID(task.ID) {
				t.Fatalf("consumed result, %s: %+v", delivery, done)
			}
		}
		if after := waitForIDs(t, nc, "wf"); !slices.Equal(before, after) {
			t.Fatalf("WaitFors %v after the consumed answers, %v before", after, before)
		}
		quietInbox(t, inbox, time.Second)
		other, _ := client.New(nc, "wf-other")
		_, err = other.WaitFor(ctx, waitfor.WaitForRequest{Wake: "task_result", Resource: task.ID, Reason: "r", Delivery: "silent"})
		wantCode(t, err, "task_agent_mismatch", "wait_for task belongs to another agent: "+task.ID)
		// Holon's rule: a task nobody started is refused, nothing registered.
		_, err = c.WaitFor(ctx, waitfor.WaitForRequest{Wake: "task_result", Resource: "wf-never-started", Reason: "r", Delivery: "silent"})
		wantCode(t, err, tasks.CodeTaskNotFound, "wait_for task does not exist: wf-never-started")
		_, err = c.WaitFor(ctx, waitfor.WaitForRequest{Wake: "task_result", Resource: "wf-never-started", Reason: "r", Delivery: "final"})
		wantCode(t, err, tasks.CodeTaskNotFound, "wait_for task does not exist: wf-never-started")
	})
	t.Run("task_result consumed through a legacy inbox consumer", func(t *testing.T) {
		lc, _ := client.New(nc, "wf-legacy")
		task, err := lc.StartTask(ctx, "wf-legacy-build", "make")
		if err != nil {
			t.Fatal(err)
		}
		finishTask(t, lc, task.ID)
		js, _ := jetstream.New(nc)
		cons, err := js.CreateOrUpdateConsumer(ctx, engine.InboxStream, jetstream.ConsumerConfig{
			Durable: "inbox-wf-legacy", FilterSubject: subjects.Inbox("wf-legacy"), AckPolicy: jetstream.AckExplicitPolicy,
		})
		if err != nil {
			t.Fatal(err)
		}
		r := registerWaitFor(t, lc, "task_result", task.ID, "silent")
		if r.Disposition != waitfor.DispositionTaskResultQueued {
			t.Fatalf("unread: %+v", r)
		}
		batch, err := cons.Fetch(10, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// The agent's cursor never moved; its consumer's ack floor did.
		r = registerWaitFor(t, lc, "task_result", task.ID, "silent")
		if r.Disposition != waitfor.DispositionTaskResultAlreadyConsumed || r.WaitRegistered {
			t.Fatalf("acked on the legacy consumer: %+v", r)
		}
	})
	t.Run("external replaces", func(t *testing.T) {
		first := registerWaitFor(t, c, "external", "github:holon-run/holon#2258", "silent")
		second := registerWaitFor(t, c, "external", "github:holon-run/holon#2258", "silent")
		if len(second.CancelledWaitConditionIDs) != 1 || second.CancelledWaitConditionIDs[0] != first.WaitID {
			t.Fatalf("replacement %+v", second)
		}
		trig, err := c.Start(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = trig
		if err := request(t, nc, subjects.Agent("wf", waitfor.ActionSystemWake), `{}`).Header.Get("Nats-Service-Error"); err != "" {
			t.Fatal(err)
		}
		// A system wake is no external event; a wake hint is. Only the
		// newer registration wakes, once.
		publishEnvelope(t, nc, subjects.Envelope{ID: "hint-1", AgentID: "wf", Kind: subjects.KindWakeHint, At: time.Now(), Trust: subjects.TrustExternal})
		publishEnvelope(t, nc, subjects.Envelope{ID: "hint-2", AgentID: "wf", Kind: subjects.KindWakeHint, At: time.Now(), Trust: subjects.TrustExternal})
		woken(t, inbox, second.WaitID, subjects.KindWakeHint, time.Second)
	})
	t.Run("monitor", func(t *testing.T) {
		var m monitors.Monitor
		if err := c.Request(ctx, monitors.ActionStart, []byte(`{"description":"CI log","command":"make test","monitor_id":"wf-ci"}`), &m); err != nil {
			t.Fatal(err)
		}
		emit := func(seq int, line string) {
			t.Helper()
			var r monitors.EmitReply
			body := fmt.Sprintf(`{"monitor_id":"wf-ci","seq":%d,"lines":[%q]}`, seq, line)
			if err := c.Request(ctx, monitors.ActionEmit, []byte(body), &r); err != nil || r.Delivered != 1 {
				t.Fatalf("emit %d: %+v %v", seq, r, err)
			}
		}
		// In the inbox before the WaitFor, not acked: it does not wake it.
		emit(0, "FAIL queued")
		r := registerWaitFor(t, c, "monitor", "wf-ci", "silent")
		if r.Continuation != waitfor.YieldAndWait || !r.WaitRegistered || r.Wake != "monitor" || r.Resource != "wf-ci" {
			t.Fatalf("reply %+v", r)
		}
		emit(1, "FAIL next")
		d := woken(t, inbox, r.WaitID, subjects.KindMonitorEvent, time.Second)
		if d.Wake != waitfor.WakeMonitor || d.Resource != "wf-ci" || d.WokenBy.EnvelopeID != monitors.EventEnvelopeID("wf-ci", 1) {
			t.Fatalf("woken %+v", d)
		}
		// Its end wakes the next WaitFor on it.
		again := registerWaitFor(t, c, "monitor", "wf-ci", "silent")
		if err := c.Request(ctx, monitors.ActionStop, []byte(`{"monitor_id":"wf-ci"}`), &m); err != nil {
			t.Fatal(err)
		}
		d = woken(t, inbox, again.WaitID, subjects.KindMonitorStopped, time.Second)
		if d.WokenBy.EnvelopeID != monitors.StoppedEnvelopeID("wf-ci") {
			t.Fatalf("woken %+v", d)
		}
		_, err := c.WaitFor(ctx, waitfor.WaitForRequest{Wake: "monitor", Resource: "wf-ci", Reason: "r", Delivery: "silent"})
		wantCode(t, err, monitors.CodeMonitorStopped, "wait_for monitor is stopped: wf-ci (stopped)")
		_, err = c.WaitFor(ctx, waitfor.WaitForRequest{Wake: "monitor", Resource: "nope", Reason: "r", Delivery: "final"})
		wantCode(t, err, monitors.CodeMonitorNotFound, "wait_for monitor does not exist: nope")
		other, _ := client.New(nc, "wf-other")
		_, err = other.WaitFor(ctx, waitfor.WaitForRequest{Wake: "monitor", Resource: "wf-ci", Reason: "r", Delivery: "silent"})
		wantCode(t, err, monitors.CodeMonitorNotFound, "wait_for monitor does not exist: wf-ci")
		_, err = c.WaitFor(ctx, waitfor.WaitForRequest{Wake: "monitor", Reason: "r", Delivery: "silent"})
		wantCode(t, err, subjects.CodeInvalidRequest, "WaitFor wake `monitor` requires non-empty `resource`")
	})
}

// publishEnvelope stores an envelope as consumer.Inbox does.
func publishEnvelope(t *testing.T, nc *nats.Conn, env subjects.Envelope) {
	t.Helper()
	m, err := env.Msg()
	if err != nil {
		t.Fatal(err)
	}
	m.Reply = nats.NewInbox()
	if _, err := nc.RequestMsg(m, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestWaitForFinalReport(t *testing.T) {
	_, nc := startChime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _ := client.New(nc, "fin")
	inbox := wfInbox(t, nc, "fin")

	// An operator message between the WaitFor and its report: the report
	// does not commit.
	r := registerWaitFor(t, c, "operator_input", "", "final")
	if r.Disposition != "awaiting_final_report" || r.WaitRegistered || r.ExpectedOutput != "final_text_only" {
		t.Fatalf("reply %+v", r)
	}
	if err := c.Intervene(ctx, interventions.ActionMessage, "wait, one more thing"); err != nil {
		t.Fatal(err)
	}
	_, err := c.Report(ctx, r.WaitID, "I am done for now")
	wantCode(t, err, waitfor.CodeWaitForInvalidated, "WaitFor "+r.WaitID+" was invalidated by a concurrent operator message; its report did not commit")
	// The message reaches the inbox after Intervene returns, and would
	// invalidate a WaitFor prepared before it lands: let it land.
	for landed := false; !landed; {
		select {
		case env := <-inbox:
			landed = env.Kind == subjects.KindIntervention
		case <-ctx.Done():
			t.Fatal("the intervention never reached the inbox")
		}
	}

	// A newer WaitFor replaces a prepared one: its report does not commit.
	older := registerWaitFor(t, c, "system", "", "final")
	newer := registerWaitFor(t, c, "system", "", "final")
	_, err = c.Report(ctx, older.WaitID, "x")
	wantCode(t, err, waitfor.CodeWaitForInvalidated, "WaitFor "+older.WaitID+" was replaced by a newer WaitFor "+newer.WaitID+"; its report did not commit")

	// Report first, then the message: committed, and the message wakes it.
	r = registerWaitFor(t, c, "operator_input", "", "final")
	got, err := c.Report(ctx, r.WaitID, "report")
	if err != nil || got.Continuation != waitfor.YieldAndWait || !got.WaitRegistered {
		t.Fatalf("report: %+v, %v", got, err)
	}
	if again, err := c.Report(ctx, r.WaitID, "report"); err != nil || again.WaitID != r.WaitID {
		t.Fatalf("repeated report: %+v, %v", again, err)
	}
	_, err = c.Report(ctx, r.WaitID, "another")
	wantCode(t, err, waitfor.CodeWaitForInvalidated, "WaitFor "+r.WaitID+" is already committed with another report")
	if err := c.Intervene(ctx, interventions.ActionMessage, "now"); err != nil {
		t.Fatal(err)
	}
	woken(t, inbox, r.WaitID, subjects.KindIntervention, time.Second)
}

func TestWaitForRecheckOnce(t *testing.T) {
	_, nc := startChime(t)
	c, _ := client.New(nc, "re")
	inbox := wfInbox(t, nc, "re")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.WaitFor(ctx, waitfor.WaitForRequest{Wake: "system", Reason: "r", Delivery: "silent", RecheckAfterMs: json.RawMessage("500")})
	if err != nil || r.RecheckAt == "" {
		t.Fatalf("%+v %v", r, err)
	}
	n := 0
	deadline := time.After(15 * time.Second)
	for n == 0 {
		select {
		case env := <-inbox:
			if env.Kind == subjects.KindRecheck {
				if env.ID != "recheck_"+r.WaitID {
					t.Fatalf("recheck %+v", env)
				}
				n++
			}
		case <-deadline:
			t.Fatal("no recheck")
		}
	}
	quiet := time.After(2 * time.Second)
	for {
		select {
		case env := <-inbox:
			if env.Kind == subjects.KindRecheck {
				t.Fatalf("a second recheck %+v", env)
			}
		case <-quiet:
			return
		}
	}
}

func TestWaitForSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	keep := func(c *config.Config) { c.DataDir = dir }
	r1, nc1 := startChimeWith(t, io.Discard, keep)
	c1, _ := client.New(nc1, "rs")
	reg := registerWaitFor(t, c1, "system", "", "silent")
	nc1.Close()
	r1.Stop(context.Background())

	_, nc := startChimeWith(t, io.Discard, keep)
	inbox := wfInbox(t, nc, "rs")
	if err := request(t, nc, subjects.Agent("rs", waitfor.ActionSystemWake), `{}`).Header.Get("Nats-Service-Error"); err != "" {
		t.Fatal(err)
	}
	woken(t, inbox, reg.WaitID, subjects.KindSystemWake, time.Second)
}

// finishTask reports a completed result for taskID.
func finishTask(t *testing.T, c *client.Client, taskID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := "ok"
	if _, err := c.ReportResult(ctx, tasks.TaskResultRequest{TaskID: taskID, Status: tasks.TaskCompleted, Output: &out}); err != nil {
		t.Fatalf("result of %s: %v", taskID, err)
	}
}

// startTasks starts n tasks and returns their IDs.
func startTasks(t *testing.T, c *client.Client, prefix string, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ids []string
	for i := range n {
		task, err := c.StartTask(ctx, fmt.Sprintf("%s-%d", prefix, i), "make test")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, task.ID)
	}
	return ids
}

// quietInbox reads the inbox for d and returns the task IDs of the
// task_result envelopes in it, failing on any wait_woken.
// consumeUpTo acks the agent's inbox through the delivery envelopeID, as
// an agent does once it has read it (inbox.fetch, inbox.ack).
func consumeUpTo(t *testing.T, c *client.Client, envelopeID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		r, err := c.FetchInbox(ctx, 256, time.Second)
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		for _, d := range r.Deliveries {
			var env subjects.Envelope
			if err := json.Unmarshal(d.Envelope, &env); err != nil {
				t.Fatal(err)
			}
			if env.ID == envelopeID {
				if _, err := c.AckInbox(ctx, d.Seq); err != nil {
					t.Fatalf("ack: %v", err)
				}
				return
			}
		}
		if len(r.Deliveries) > 0 {
			if _, err := c.AckInbox(ctx, r.Deliveries[len(r.Deliveries)-1].Seq); err != nil {
				t.Fatalf("ack: %v", err)
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("%s not in the inbox", envelopeID)
		}
	}
}

// waitForIDs lists the keys of the agent's WaitFor records.
func waitForIDs(t *testing.T, nc *nats.Conn, agentID string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, engine.WaitForBucket)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.ListKeysFiltered(ctx, "rec."+agentID+".>")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for k := range keys.Keys() {
		ids = append(ids, k)
	}
	slices.Sort(ids)
	return ids
}

func quietInbox(t *testing.T, inbox chan subjects.Envelope, d time.Duration) []string {
	t.Helper()
	var results []string
	end := time.After(d)
	for {
		select {
		case env := <-inbox:
			switch env.Kind {
			case subjects.KindWaitWoken:
				t.Fatalf("an early wait_woken: %s", env.Data)
			case subjects.KindTaskResult:
				results = append(results, env.Source.ID)
			}
		case <-end:
			return results
		}
	}
}

func TestWaitForTasks(t *testing.T) {
	_, nc := startChime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, _ := client.New(nc, "wt")
	inbox := wfInbox(t, nc, "wt")

	t.Run("all", func(t *testing.T) {
		ids := startTasks(t, c, "all", 3)
		r, err := c.WaitTasks(ctx, waitfor.WaitTasksRequest{TaskIDs: ids, Mode: "all", Reason: "the three builds"})
		if err != nil || r.Continuation != waitfor.YieldAndWait || r.Disposition != "registered" || !r.WaitRegistered ||
			r.Wake != "task_result" || r.Mode != "all" || len(r.TaskIDs) != 3 || len(r.SeenTaskIDs) != 0 {
			t.Fatalf("reply %+v, %v", r, err)
		}
		finishTask(t, c, ids[0])
		finishTask(t, c, ids[1])
		finishTask(t, c, ids[1]) // the same result again: absorbed
		if got := quietInbox(t, inbox, 2*time.Second); len(got) != 2 {
			t.Fatalf("task results before the last %v, want 2", got)
		}
		finishTask(t, c, ids[2])
		// The last result comes first, then the one wait_woken.
		var before []string
		for len(before) == 0 || before[len(before)-1] != "woken" {
			select {
			case env := <-inbox:
				switch env.Kind {
				case subjects.KindTaskResult:
					before = append(before, env.Source.ID)
				case subjects.KindWaitWoken:
					before = append(before, "woken")
					var d waitfor.WaitWokenData
					if err := json.Unmarshal(env.Data, &d); err != nil || d.WaitID != r.WaitID || d.Mode != "all" ||
						!slices.Equal(d.TaskIDs, ids) || d.WokenBy.Source.ID != ids[2] || d.WokenBy.EnvelopeID != tasks.TaskEnvelopeID(ids[2]) {
						t.Fatalf("wait_woken %s (%v)", env.Data, err)
					}
				}
			case <-ctx.Done():
				t.Fatal("no wait_woken")
			}
		}
		if !slices.Equal(before, []string{ids[2], "woken"}) {
			t.Fatalf("inbox order %v", before)
		}
		quietInbox(t, inbox, time.Second)
	})
	t.Run("any", func(t *testing.T) {
		ids := startTasks(t, c, "any", 3)
		r, err := c.WaitTasks(ctx, waitfor.WaitTasksRequest{TaskIDs: ids, Mode: "any", Reason: "the first build"})
		if err != nil || r.Continuation != waitfor.YieldAndWait {
			t.Fatalf("reply %+v, %v", r, err)
		}
		finishTask(t, c, ids[1])
		d := woken(t, inbox, r.WaitID, subjects.KindTaskResult, 0)
		if d.Mode != "any" || d.WokenBy.Source.ID != ids[1] {
			t.Fatalf("woken %+v", d)
		}
		finishTask(t, c, ids[0])
		finishTask(t, c, ids[2])
		if got := quietInbox(t, inbox, 2*time.Second); len(got) != 2 {
			t.Fatalf("task results after the wake %v, want 2", got)
		}
	})
	t.Run("any with one finished", func(t *testing.T) {
		ids := startTasks(t, c, "done", 2)
		finishTask(t, c, ids[1])
		quietInbox(t, inbox, 500*time.Millisecond)
		r, err := c.WaitTasks(ctx, waitfor.WaitTasksRequest{TaskIDs: ids, Mode: "any", Reason: "either"})
		if err != nil || r.Continuation != waitfor.YieldAndReenter || r.Disposition != waitfor.DispositionTaskResultQueued || r.WaitRegistered ||
			r.TaskID != ids[1] || r.ResultMessageID != tasks.TaskEnvelopeID(ids[1]) || !slices.Equal(r.SeenTaskIDs, ids[1:]) {
			t.Fatalf("reply %+v, %v", r, err)
		}
		// The queued result re-enters; no wait_woken follows it.
		finishTask(t, c, ids[0])
		quietInbox(t, inbox, time.Second)
	})
	t.Run("consumed", func(t *testing.T) {
		ids := startTasks(t, c, "eaten", 3)
		finishTask(t, c, ids[0])
		finishTask(t, c, ids[1])
		quietInbox(t, inbox, 500*time.Millisecond)
		consumeUpTo(t, c, tasks.TaskEnvelopeID(ids[0]))
		// any: the one result consumed satisfies it, but a queued one is
		// there too: that one re-enters.
		r, err := c.WaitTasks(ctx, waitfor.WaitTasksRequest{TaskIDs: ids, Mode: "any", Reason: "either"})
		if err != nil || r.Disposition != waitfor.DispositionTaskResultQueued || r.WaitRegistered || r.TaskID != ids[1] {
			t.Fatalf("any, one consumed and one queued: %+v, %v", r, err)
		}
		consumeUpTo(t, c, tasks.TaskEnvelopeID(ids[1]))
		// any, every finished result consumed: nothing will come again.
		r, err = c.WaitTasks(ctx, waitfor.WaitTasksRequest{TaskIDs: ids, Mode: "any", Reason: "either"})
		if err != nil || r.Continuation != waitfor.ContinueTurn || r.Disposition != waitfor.DispositionTaskResultAlreadyConsumed ||
			r.WaitRegistered || r.WaitID != "" || !slices.Equal(r.SeenTaskIDs, ids[:2]) {
			t.Fatalf("any, consumed: %+v, %v", r, err)
		}
		// all, one still running: registered as ever, the consumed ones
		// counted; the last result wakes it.
		r, err = c.WaitTasks(ctx, waitfor.WaitTasksRequest{TaskIDs: ids, Mode: "all", Reason: "all three"})
		if err != nil || r.Continuation != waitfor.YieldAndWait || !r.WaitRegistered || !slices.Equal(r.SeenTaskIDs, ids[:2]) {
			t.Fatalf("all, two consumed: %+v, %v", r, err)
		}
		finishTask(t, c, ids[2])
		if d := woken(t, inbox, r.WaitID, subjects.KindTaskResult, time.Second); d.WokenBy.Source.ID != ids[2] {
			t.Fatalf("woken %+v", d)
		}
		consumeUpTo(t, c, tasks.TaskEnvelopeID(ids[2]))
		// all, every result consumed.
		r, err = c.WaitTasks(ctx, waitfor.WaitTasksRequest{TaskIDs: ids, Mode: "all", Reason: "all three", Delivery: "final"})
		if err != nil || r.Disposition != waitfor.DispositionTaskResultAlreadyConsumed || r.WaitRegistered || r.WaitID != "" {
			t.Fatalf("all, consumed: %+v, %v", r, err)
		}
		quietInbox(t, inbox, time.Second)
	})
	t.Run("final", func(t *testing.T) {
		// Results stored while the report is pending count once it commits.
		ids := startTasks(t, c, "fin", 2)
		finishTask(t, c, ids[0])
		r, err := c.WaitTasks(ctx, waitfor.WaitTasksRequest{TaskIDs: ids, Mode: "all", Reason: "both", Delivery: "final"})
		if err != nil || r.Disposition != waitfor.DispositionAwaitingFinalReport || !slices.Equal(r.SeenTaskIDs, ids[:1]) {
			t.Fatalf("reply %+v, %v", r, err)
		}
		finishTask(t, c, ids[1])
		quietInbox(t, inbox, 500*time.Millisecond)
		if _, err := c.Report(ctx, r.WaitID, "waiting on both builds"); err != nil {
			t.Fatal(err)
		}
		d := woken(t, inbox, r.WaitID, subjects.KindTaskResult, time.Second)
		if d.WokenBy.Source.ID != ids[1] {
			t.Fatalf("woken %+v", d)
		}
		// Satisfied at registration by queued results: no report to
		// wait for, nothing registered, the queued result re-enters.
		r, err = c.WaitTasks(ctx, waitfor.WaitTasksRequest{TaskIDs: ids, Mode: "all", Reason: "both again", Delivery: "final"})
		if err != nil || r.Disposition != waitfor.DispositionTaskResultQueued || r.Continuation != waitfor.YieldAndReenter || r.WaitRegistered {
			t.Fatalf("reply %+v, %v", r, err)
		}
		quietInbox(t, inbox, time.Second)
	})
	t.Run("bad input", func(t *testing.T) {
		ids := startTasks(t, c, "bad", 1)
		_, err := c.WaitTasks(ctx, waitfor.WaitTasksRequest{Mode: "all", Reason: "r"})
		wantCode(t, err, subjects.CodeInvalidRequest, "task_ids must not be empty")
		_, err = c.WaitTasks(ctx, waitfor.WaitTasksRequest{TaskIDs: ids, Mode: "most", Reason: "r"})
		wantCode(t, err, subjects.CodeInvalidRequest, "mode must be all or any")
		_, err = c.WaitTasks(ctx, waitfor.WaitTasksRequest{TaskIDs: []string{ids[0], ids[0]}, Mode: "all", Reason: "r"})
		wantCode(t, err, subjects.CodeInvalidRequest, "task_ids must not repeat "+ids[0])
		_, err = c.WaitTasks(ctx, waitfor.WaitTasksRequest{TaskIDs: []string{"a.b"}, Mode: "all", Reason: "r"})
		wantCode(t, err, subjects.CodeInvalidID, `task_id "a.b" may only contain letters, digits, '_' and '-'`)
		other, _ := client.New(nc, "wt-other")
		_, err = other.WaitTasks(ctx, waitfor.WaitTasksRequest{TaskIDs: ids, Mode: "any", Reason: "r"})
		wantCode(t, err, "task_agent_mismatch", "wait_for task belongs to another agent: "+ids[0])
		_, err = c.WaitTasks(ctx, waitfor.WaitTasksRequest{TaskIDs: []string{ids[0], "bad-never-started"}, Mode: "all", Reason: "r"})
		wantCode(t, err, tasks.CodeTaskNotFound, "wait_for task does not exist: bad-never-started")
	})
}
