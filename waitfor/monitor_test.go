package waitfor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
	"github.com/chime-nats/chime/waitfor"
)

// monEnv is a WaitFor service with its monitor check wired, the wakes
// consumer running over its index, and the monitors store that emits and
// stops, on one embedded JetStream.
type monEnv struct {
	res      *engine.Resources
	store    *waitfor.Store
	svc      *waitfor.Service
	monitors *monitors.Store
}

func newMonEnv(t *testing.T) *monEnv {
	t.Helper()
	_, res := natstest.Provisioned(t, natstest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	inbox := consumer.NewInbox(res.JS, engine.InboxStream, time.Minute, nil)
	e := &monEnv{res: res, store: waitfor.NewStore(res.WaitFor, nil, kvrec.Retention{JS: res.JS})}
	e.monitors = monitors.NewStore(monitors.Config{KV: res.Monitors, JS: res.JS, Inbox: inbox,
		Retention: kvrec.Retention{JS: res.JS, After: time.Hour, Markers: time.Minute}})
	e.svc = waitfor.NewService(waitfor.Config{
		Store: e.store, Timers: timers.NewStore(res.Timers, nil, kvrec.Retention{}), Monitors: e.monitors,
		Inbox: inbox, JS: res.JS, InboxStream: engine.InboxStream, EventsStream: engine.EventsStream,
	})
	ix := waitfor.NewIndex(res.JS, engine.WaitForBucket, nil)
	if err := ix.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ix.Stop(context.Background()) })
	c := waitfor.NewConsumer(waitfor.ConsumerConfig{JS: res.JS, Service: e.svc, Store: e.store, Index: ix,
		InboxStream: engine.InboxStream, WaitForStream: engine.WaitForStream})
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return e
}

// start starts a running command monitor of the agent's, as id.
func (e *monEnv) start(t *testing.T, agentID, id string) {
	t.Helper()
	spec, err := monitors.DecodeStart([]byte(`{"description":"CI log","command":"make test","monitor_id":"` + id + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.monitors.Start(context.Background(), agentID, spec); err != nil {
		t.Fatal(err)
	}
}

// emit sends batch seq of a command monitor's lines, as its executor
// would, and returns the inbox sequence its monitor_event is stored at.
func (e *monEnv) emit(t *testing.T, agentID, id string, seq int64, lines ...string) uint64 {
	t.Helper()
	ctx := context.Background()
	r, err := e.monitors.Emit(ctx, agentID, &monitors.EmitRequest{MonitorID: id, Seq: &seq, Lines: lines})
	if err != nil || r.Delivered != len(lines) {
		t.Fatalf("emit %s %d: %+v %v", id, seq, r, err)
	}
	return e.seqOf(t, agentID, monitors.EventEnvelopeID(id, seq))
}

// seqOf is the inbox sequence of the agent's envelope envID.
func (e *monEnv) seqOf(t *testing.T, agentID, envID string) uint64 {
	t.Helper()
	// The record says woken before its wait_woken is stored: wait for it.
	var seq uint64
	testwait.Until(t, 10*time.Second, func() (bool, string) {
		for _, m := range e.inbox(t, agentID) {
			if m.env.ID == envID {
				seq = m.seq
				return true, ""
			}
		}
		return false, "not stored yet"
	}, "%s in %s's inbox", envID, agentID)
	return seq
}

type stored struct {
	env subjects.Envelope
	seq uint64
}

// inbox reads the agent's envelopes from the inbox stream.
func (e *monEnv) inbox(t *testing.T, agentID string) []stored {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.res.JS.OrderedConsumer(ctx, engine.InboxStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subjects.Inbox(agentID)}})
	if err != nil {
		t.Fatal(err)
	}
	var out []stored
	for left := c.CachedInfo().NumPending; left > 0; left-- {
		m, err := c.Next(jetstream.FetchMaxWait(2 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var env subjects.Envelope
		if err := json.Unmarshal(m.Data(), &env); err != nil {
			t.Fatal(err)
		}
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, stored{env, md.Sequence.Stream})
	}
	return out
}

// processed waits until the wakes consumer has acknowledged every inbox
// envelope up to seq: whatever they were to change is changed.
func (e *monEnv) processed(t *testing.T, seq uint64) {
	t.Helper()
	ctx := context.Background()
	testwait.Until(t, 10*time.Second, func() (bool, string) {
		c, err := e.res.JS.Consumer(ctx, engine.InboxStream, waitfor.WakesDurable)
		if err != nil {
			return false, err.Error()
		}
		info, err := c.Info(ctx)
		if err != nil {
			return false, err.Error()
		}
		return info.AckFloor.Stream >= seq, fmt.Sprint("ack floor ", info.AckFloor.Stream)
	}, "the wakes consumer past inbox sequence %d", seq)
}

func (e *monEnv) waitFor(t *testing.T, agentID, body string) (*waitfor.WaitForReply, error) {
	t.Helper()
	spec, err := waitfor.DecodeWaitFor([]byte(body))
	if err != nil {
		return nil, err
	}
	return e.svc.WaitFor(context.Background(), agentID, spec)
}

// status waits until the registration is status, and returns it.
func (e *monEnv) status(t *testing.T, agentID, waitID string, status waitfor.WaitForStatus) *waitfor.WaitFor {
	t.Helper()
	var w *waitfor.WaitFor
	testwait.Until(t, 10*time.Second, func() (bool, string) {
		var err error
		if w, err = e.store.Get(context.Background(), agentID, waitID); err != nil {
			t.Fatal(err)
		}
		return w.Status == status, string(w.Status)
	}, "WaitFor %s %s", waitID, status)
	return w
}

// wokenOnce checks that the agent's inbox holds one wait_woken, of
// waitID, woken by the envelope envID of kind.
func (e *monEnv) wokenOnce(t *testing.T, agentID, waitID, kind, envID string) {
	t.Helper()
	var woken []waitfor.WaitWokenData
	for _, m := range e.inbox(t, agentID) {
		if m.env.Kind != subjects.KindWaitWoken {
			continue
		}
		var d waitfor.WaitWokenData
		if err := json.Unmarshal(m.env.Data, &d); err != nil {
			t.Fatal(err)
		}
		woken = append(woken, d)
	}
	if len(woken) != 1 || woken[0].WaitID != waitID || woken[0].Wake != waitfor.WakeMonitor ||
		woken[0].WokenBy.Kind != kind || woken[0].WokenBy.EnvelopeID != envID || woken[0].WokenBy.Source != (subjects.Source{Type: "monitor", ID: woken[0].Resource}) {
		t.Fatalf("wait_woken deliveries %+v, want one of %s by %s %s", woken, waitID, kind, envID)
	}
}

// TestWaitForMonitorEvent: a WaitFor on a running monitor is registered;
// an event of that monitor queued before it (not acked) does not wake
// it, nor does another monitor's event; the monitor's next event does,
// once, with one wait_woken naming that event.
func TestWaitForMonitorEvent(t *testing.T) {
	e := newMonEnv(t)
	e.start(t, "m1", "ci")
	e.start(t, "m1", "deploy")
	queued := e.emit(t, "m1", "ci", 0, "FAIL before the wait")
	r, err := e.waitFor(t, "m1", `{"wake":"monitor","resource":"ci","reason":"the next CI failure","delivery":"silent"}`)
	if err != nil {
		t.Fatal(err)
	}
	if r.Continuation != waitfor.YieldAndWait || r.Disposition != waitfor.DispositionRegistered || !r.WaitRegistered ||
		r.Wake != "monitor" || r.Resource != "ci" {
		t.Fatalf("reply %+v", r)
	}
	w, err := e.store.Get(context.Background(), "m1", r.WaitID)
	if err != nil || w.SinceSeq < queued {
		t.Fatalf("registration %+v (%v): since before the queued event at %d", w, err, queued)
	}
	other := e.emit(t, "m1", "deploy", 0, "deployed")
	e.processed(t, other)
	if w := e.status(t, "m1", r.WaitID, waitfor.WaitForActive); w.WokenBy != nil {
		t.Fatalf("woken by %+v", w.WokenBy)
	}
	e.emit(t, "m1", "ci", 1, "FAIL after the wait")
	got := e.status(t, "m1", r.WaitID, waitfor.WaitForWoken)
	if got.WokenBy == nil || got.WokenBy.Kind != subjects.KindMonitorEvent || got.WokenBy.EnvelopeID != monitors.EventEnvelopeID("ci", 1) {
		t.Fatalf("woken by %+v", got.WokenBy)
	}
	last := e.emit(t, "m1", "ci", 2, "FAIL again")
	e.processed(t, last)
	e.wokenOnce(t, "m1", r.WaitID, subjects.KindMonitorEvent, monitors.EventEnvelopeID("ci", 1))
}

// TestWaitForMonitorStopped: a monitor's end wakes a WaitFor on it, by
// its monitor_stopped: a stopped monitor sends no more events.
func TestWaitForMonitorStopped(t *testing.T) {
	e := newMonEnv(t)
	e.start(t, "m2", "tail")
	r, err := e.waitFor(t, "m2", `{"wake":"monitor","resource":"tail","reason":"the log","delivery":"silent"}`)
	if err != nil || !r.WaitRegistered {
		t.Fatalf("reply %+v %v", r, err)
	}
	code := 1
	if _, err := e.monitors.Stop(context.Background(), "m2", &monitors.StopRequest{MonitorID: "tail", ExitCode: &code}); err != nil {
		t.Fatal(err)
	}
	got := e.status(t, "m2", r.WaitID, waitfor.WaitForWoken)
	if got.WokenBy == nil || got.WokenBy.Kind != subjects.KindMonitorStopped || got.WokenBy.EnvelopeID != monitors.StoppedEnvelopeID("tail") {
		t.Fatalf("woken by %+v", got.WokenBy)
	}
	e.processed(t, e.seqOf(t, "m2", waitfor.WaitWokenEnvelope(got).ID))
	e.wokenOnce(t, "m2", r.WaitID, subjects.KindMonitorStopped, monitors.StoppedEnvelopeID("tail"))
}

// TestWaitForMonitorRefused: a monitor that is unknown, another agent's
// or stopped is refused with its code, and nothing is registered; a
// missing or malformed resource is refused before any lookup.
func TestWaitForMonitorRefused(t *testing.T) {
	e := newMonEnv(t)
	e.start(t, "m3", "ci")
	e.start(t, "m3", "done")
	if _, err := e.monitors.Stop(context.Background(), "m3", &monitors.StopRequest{MonitorID: "done"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		agent, body, code, msg string
		status                 int
	}{
		{"m3", `{"wake":"monitor","resource":"nope","reason":"r","delivery":"silent"}`, monitors.CodeMonitorNotFound, "wait_for monitor does not exist: nope", 404},
		{"m3", `{"wake":"monitor","resource":"nope","reason":"r","delivery":"final"}`, monitors.CodeMonitorNotFound, "wait_for monitor does not exist: nope", 404},
		{"m3-other", `{"wake":"monitor","resource":"ci","reason":"r","delivery":"silent"}`, monitors.CodeMonitorNotFound, "wait_for monitor does not exist: ci", 404},
		{"m3", `{"wake":"monitor","resource":"done","reason":"r","delivery":"silent"}`, monitors.CodeMonitorStopped, "wait_for monitor is stopped: done (stopped)", 409},
		{"m3", `{"wake":"monitor","resource":"done","reason":"r","delivery":"final"}`, monitors.CodeMonitorStopped, "wait_for monitor is stopped: done (stopped)", 409},
		{"m3", `{"wake":"monitor","reason":"r","delivery":"silent"}`, subjects.CodeInvalidRequest, "WaitFor wake `monitor` requires non-empty `resource`", 0},
		{"m3", `{"wake":"monitor","resource":" ","reason":"r","delivery":"silent"}`, subjects.CodeInvalidRequest, "WaitFor wake `monitor` requires non-empty `resource`", 0},
		{"m3", `{"wake":"monitor","resource":"m3.ci","reason":"r","delivery":"silent"}`, subjects.CodeInvalidID, `resource "m3.ci" may only contain letters, digits, '_' and '-'`, 0},
	} {
		r, err := e.waitFor(t, tc.agent, tc.body)
		var got *subjects.Error
		if !errors.As(err, &got) || got.Code != tc.code || got.Message != tc.msg || got.Status != tc.status {
			t.Errorf("%s %s: got %+v (%v), want %s %q (%d)", tc.agent, tc.body, r, err, tc.code, tc.msg, tc.status)
		}
	}
	for _, agent := range []string{"m3", "m3-other"} {
		if ws, _, err := e.store.List(context.Background(), agent, 10, subjects.CursorPos{}); err != nil || len(ws) != 0 {
			t.Errorf("%s's WaitFors after the refusals: %+v %v", agent, ws, err)
		}
	}
	// The running one is accepted.
	if r, err := e.waitFor(t, "m3", `{"wake":"monitor","resource":"ci","reason":"r","delivery":"silent"}`); err != nil || !r.WaitRegistered {
		t.Fatalf("running monitor: %+v %v", r, err)
	}
}

// TestMatchesMonitor: a WaitFor on a monitor matches that monitor's
// monitor_event and monitor_stopped for its agent stored after it, and
// nothing else: not another monitor's, not another agent's, not an
// envelope of another kind from the same source ID, not one stored at or
// before its since.
func TestMatchesMonitor(t *testing.T) {
	w := &waitfor.WaitFor{AgentID: "a", Wake: waitfor.WakeMonitor, Resource: "ci", SinceSeq: 10, Status: waitfor.WaitForActive}
	mon := func(kind, agentID, id string) *subjects.Envelope {
		return &subjects.Envelope{ID: "e", AgentID: agentID, Kind: kind, Source: subjects.Source{Type: "monitor", ID: id}}
	}
	for _, tc := range []struct {
		name string
		env  *subjects.Envelope
		seq  uint64
		want bool
	}{
		{"its event", mon(subjects.KindMonitorEvent, "a", "ci"), 11, true},
		{"its end", mon(subjects.KindMonitorStopped, "a", "ci"), 11, true},
		{"its event at since", mon(subjects.KindMonitorEvent, "a", "ci"), 10, false},
		{"its end before since", mon(subjects.KindMonitorStopped, "a", "ci"), 9, false},
		{"another monitor's event", mon(subjects.KindMonitorEvent, "a", "deploy"), 11, false},
		{"another monitor's end", mon(subjects.KindMonitorStopped, "a", "deploy"), 11, false},
		{"another agent's monitor of the same ID", mon(subjects.KindMonitorEvent, "b", "ci"), 11, false},
		{"a task result of the same ID", &subjects.Envelope{AgentID: "a", Kind: subjects.KindTaskResult, Source: subjects.Source{Type: "task", ID: "ci"}}, 11, false},
		{"a wake hint", &subjects.Envelope{AgentID: "a", Kind: subjects.KindWakeHint}, 11, false},
	} {
		if got := waitfor.Matches(w, tc.env, tc.seq); got != tc.want {
			t.Errorf("%s: Matches %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestMonitorCodes: the codes of the monitor checks, spelt out in waitfor
// (which must not link monitors), are the monitors package's.
func TestMonitorCodes(t *testing.T) {
	if waitfor.CodeMonitorNotFound != monitors.CodeMonitorNotFound || waitfor.CodeMonitorStopped != monitors.CodeMonitorStopped {
		t.Fatalf("waitfor's %s, %s; monitors' %s, %s", waitfor.CodeMonitorNotFound, waitfor.CodeMonitorStopped,
			monitors.CodeMonitorNotFound, monitors.CodeMonitorStopped)
	}
}
