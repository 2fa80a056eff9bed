package monitors_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/consumer"
	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/internal/natstest"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/quotas"
	"github.com/chime-nats/chime/subjects"
)

type env struct {
	nc    *nats.Conn
	store *monitors.Store
	index *monitors.Index
	res   *engine.Resources
	now   time.Time
}

// newEnv is a store on an embedded JetStream, admitting at most max
// running monitors an agent, with a clock the test moves.
func newEnv(t *testing.T, max int) *env {
	t.Helper()
	return newEnvWith(t, max, monitors.SubjectPolicy{}, nil)
}

// newEnvWith is newEnv with the subjects agents may watch and, when now is
// set, that clock instead of the test's.
func newEnvWith(t *testing.T, max int, watchable monitors.SubjectPolicy, now func() time.Time) *env {
	t.Helper()
	nc, res := natstest.Provisioned(t, natstest.Server(t))
	e := &env{nc: nc, res: res, now: time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)}
	if now == nil {
		now = func() time.Time { return e.now }
	}
	e.index = monitors.NewIndex(res.JS, engine.MonitorsBucket, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.index.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.index.Stop(context.Background()) })
	e.store = monitors.NewStore(monitors.Config{
		KV: res.Monitors, JS: res.JS, Inbox: consumer.NewInbox(res.JS, engine.InboxStream, 2*time.Minute, nil),
		Now: now, Retention: kvrec.Retention{JS: res.JS, After: time.Hour, Markers: time.Minute},
		Admit: quotas.New(quotas.Config{MaxMonitors: max}), Count: e.index, Sources: map[string]monitors.Checker{monitors.SourceSubject: watchable},
	})
	return e
}

// inbox reads the agent's envelopes of kind from the inbox stream.
func (e *env) inbox(t *testing.T, agentID, kind string) []subjects.Envelope {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.res.JS.OrderedConsumer(ctx, engine.InboxStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subjects.Inbox(agentID)}})
	if err != nil {
		t.Fatal(err)
	}
	var out []subjects.Envelope
	for left := c.CachedInfo().NumPending; left > 0; left-- {
		m, err := c.Next(jetstream.FetchMaxWait(2 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var env subjects.Envelope
		if err := json.Unmarshal(m.Data(), &env); err != nil {
			t.Fatal(err)
		}
		if env.Kind == kind {
			out = append(out, env)
		}
	}
	return out
}

func start(t *testing.T, e *env, agentID, body string) *monitors.Monitor {
	t.Helper()
	spec, err := monitors.DecodeStart([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	m, err := e.store.Start(context.Background(), agentID, spec)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestLimitCountsRunningMonitors: the index counts running monitors per
// agent; a stopped one frees its place; other agents are not counted.
func TestLimitCountsRunningMonitors(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	a := start(t, e, "a1", `{"description":"one","command":"x"}`)
	start(t, e, "a1", `{"description":"two","command":"x"}`)
	start(t, e, "a2", `{"description":"other","command":"x"}`)
	testwait.Eventually(t, 5*time.Second, func() bool { return e.index.Running("a1") == 2 && e.index.Running("a2") == 1 })
	spec, _ := monitors.DecodeStart([]byte(`{"description":"three","command":"x"}`))
	if _, err := e.store.Start(ctx, "a1", spec); !errors.Is(err, &subjects.Error{Code: subjects.CodeQuotaExceeded}) {
		t.Fatalf("third: %v", err)
	}
	if _, err := e.store.Stop(ctx, "a1", &monitors.StopRequest{MonitorID: a.ID}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 5*time.Second, func() bool { return e.index.Running("a1") == 1 })
	if _, err := e.store.Start(ctx, "a1", spec); err != nil {
		t.Fatalf("after a stop: %v", err)
	}
}

// TestStopInterruptedIsDeliveredByGet: a monitor stored stopped without
// its monitor_stopped (a crash between) gets it delivered by the next
// get, once, however often it is read.
func TestStopInterruptedIsDeliveredByGet(t *testing.T) {
	e := newEnv(t, 0)
	ctx := context.Background()
	m := start(t, e, "a1", `{"description":"log","command":"tail -f x","timeout_ms":1000}`)
	if m.ExpiresAt == nil || !m.ExpiresAt.Equal(e.now.Add(time.Second)) {
		t.Fatalf("expires_at %v", m.ExpiresAt)
	}
	// Stopped as a crashed replica leaves it: the record, no delivery.
	at := e.now
	if _, _, err := kvrec.Update(ctx, e.res.Monitors, monitors.Key("a1", m.ID), false, func(m *monitors.Monitor) (bool, error) {
		m.Status, m.StoppedAt, m.StopReason = monitors.Stopped, &at, monitors.ReasonStopped
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		got, err := e.store.Get(ctx, "a1", m.ID)
		if err != nil || got.DeliveredAt == nil {
			t.Fatalf("get: %+v %v", got, err)
		}
	}
	if envs := e.inbox(t, "a1", subjects.KindMonitorStopped); len(envs) != 1 || envs[0].ID != "monitor_"+m.ID+"_stopped" {
		t.Fatalf("deliveries: %+v", envs)
	}
}
