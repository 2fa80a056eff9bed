package monitors_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chime-nats/chime/engine"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/subjects"
)

// owner holds every shard or none, as the test says.
type owner struct{ all atomic.Bool }

func (o *owner) Owned(_ time.Time, owned []bool) {
	for i := range owned {
		owned[i] = o.all.Load()
	}
}

// TestWatcherFollowsTheShard: a subject monitor is watched only while its
// replica holds the monitor's shard; its matching messages become
// monitor_event lines "<subject> <payload>"; when the shard goes and comes
// back the watch resumes at the record's next seq (no envelope ID twice);
// a stop ends the watch.
func TestWatcherFollowsTheShard(t *testing.T) {
	policy, err := monitors.NewSubjectPolicy([]string{"ci.>"}, engine.InternalSubjects())
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, 0, policy, time.Now)
	ctx := context.Background()
	if _, err := e.store.Start(ctx, "a1", mustSpec(t, `{"description":"d","subject":"agent.a2.inbox"}`)); err == nil ||
		!strings.Contains(err.Error(), monitors.CodeSubjectNotAllowed) {
		t.Fatalf("another agent's inbox: %v", err)
	}
	m := start(t, e, "a1", `{"description":"CI","subject":"ci.*.status","match":"FAIL"}`)
	o := &owner{}
	w := monitors.NewWatcher(monitors.WatcherConfig{Feeds: map[string]monitors.Feed{monitors.SourceSubject: monitors.SubjectFeed{NC: e.nc}}, Store: e.store, Index: e.index, Leases: o, Shards: 8, Every: 20 * time.Millisecond})
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(ctx) }()
	testwait.Eventually(t, 5*time.Second, func() bool { return e.index.Running("a1") == 1 })
	if w.Watching() != 0 {
		t.Fatal("watching a shard it does not hold")
	}

	// published until a batch with the line arrives: the subscription
	// starts a moment after the watch.
	seen := func(line string) bool {
		for _, env := range e.inbox(t, "a1", subjects.KindMonitorEvent) {
			var d monitors.EventData
			if err := json.Unmarshal(env.Data, &d); err != nil {
				t.Fatal(err)
			}
			if slices.Contains(d.Lines, line) {
				return true
			}
		}
		return false
	}
	n := 0
	publishUntilSeen := func(payload string) {
		t.Helper()
		var sent []string
		testwait.Eventually(t, 10*time.Second, func() bool {
			n++
			p := fmt.Sprintf("%s %d", payload, n)
			for _, body := range []string{fmt.Sprintf("pass %d", n), p} {
				if err := e.nc.Publish("ci.build.status", []byte(body)); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.nc.Flush(); err != nil {
				t.Fatal(err)
			}
			sent = append(sent, "ci.build.status "+p)
			return slices.ContainsFunc(sent, seen)
		}, payload)
	}
	o.all.Store(true)
	testwait.Eventually(t, 5*time.Second, func() bool { return w.Watching() == 1 })
	publishUntilSeen("FAIL first")
	o.all.Store(false) // the shard moves away
	testwait.Eventually(t, 5*time.Second, func() bool { return w.Watching() == 0 })
	o.all.Store(true) // and back
	publishUntilSeen("FAIL again")

	events := e.inbox(t, "a1", subjects.KindMonitorEvent)
	ids := map[string]bool{}
	for _, env := range events {
		if ids[env.ID] || env.Trust != subjects.TrustExternal || strings.Contains(env.Text, "pass") {
			t.Fatalf("events: %+v", events)
		}
		ids[env.ID] = true
	}
	rec, err := e.store.Get(ctx, "a1", m.ID)
	if err != nil || rec.Events < 2 || rec.Filtered < 2 {
		t.Fatalf("record: %+v %v", rec, err)
	}
	if _, err := e.store.Stop(ctx, "a1", &monitors.StopRequest{MonitorID: m.ID}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 5*time.Second, func() bool { return w.Watching() == 0 })
}

func mustSpec(t *testing.T, body string) *monitors.Spec {
	t.Helper()
	s, err := monitors.DecodeStart([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return s
}
