package fleet

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/chime-nats/chime/internal/kvwatch"
)

func put(key, value string) kvwatch.Entry { return kvwatch.Entry{Key: key, Value: []byte(value)} }
func del(key string) kvwatch.Entry        { return kvwatch.Entry{Key: key, Deleted: true} }

func one(t *testing.T, ix *Index, id string) (Agent, bool) {
	t.Helper()
	for _, a := range ix.List(Query{Limit: 1000}).Agents {
		if a.AgentID == id {
			return a, true
		}
	}
	return Agent{}, false
}

// TestApply: open records are counted exactly however often they change;
// a finished record keeps its agent listed (counted in the load, or when
// an open one ends) until it is deleted; a replay changes nothing; the
// lifecycle record sets the state.
func TestApply(t *testing.T) {
	ix := New(nil, Buckets{}, nil)
	ix.apply(Timers, "T", put("a.t1", `{"agent_id":"a","status":"completed"}`), true)
	if a, ok := one(t, ix, "a"); !ok || a.Timers != 0 || a.State != StateActive {
		t.Fatalf("a finished timer in the load: %+v %v", a, ok)
	}
	ix.apply(Timers, "T", del("a.t1"), false)
	if _, ok := one(t, ix, "a"); ok {
		t.Fatal("an agent whose only record went is still listed")
	}

	sub, cancel, err := ix.Subscribe(2, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	if _, _, err := ix.Subscribe(2, 1); !errors.Is(err, ErrTooMany) {
		t.Fatalf("a second subscriber beyond the limit: %v", err)
	}
	// Sharded keys name the agent second.
	ix.apply(Timers, "T", put("3.b.t2", `{"agent_id":"b","status":"active"}`), false)
	ix.apply(Timers, "T", put("3.b.t2", `{"agent_id":"b","status":"active"}`), false)
	if a, _ := one(t, ix, "b"); a.Timers != 1 {
		t.Fatalf("an update counted twice: %+v", a)
	}
	if c := <-sub.C; c.Kind != "timers" || c.Agent.AgentID != "b" || c.Agent.Timers != 1 {
		t.Fatalf("change: %+v", c)
	}
	<-sub.C
	ix.apply(Timers, "T", kvwatch.Entry{Key: "3.b.t2", Value: []byte(`{"agent_id":"b","status":"cancelled"}`), Again: true}, false)
	if a, _ := one(t, ix, "b"); a.Timers != 1 {
		t.Fatalf("a replay applied: %+v", a)
	}
	ix.apply(Timers, "T", put("3.b.t2", `{"agent_id":"b","status":"cancelled"}`), false)
	if a, ok := one(t, ix, "b"); !ok || a.Timers != 0 {
		t.Fatalf("ended: %+v %v", a, ok)
	}
	ix.apply(Timers, "T", del("3.b.t2"), false)
	if _, ok := one(t, ix, "b"); ok {
		t.Fatal("b listed with no record")
	}
	<-sub.C // the cancel
	if c := <-sub.C; !c.Gone || c.Agent.AgentID != "b" {
		t.Fatalf("the last change: %+v", c)
	}

	ix.apply(Waits, "W", put("c.w", `{"agent_id":"c","status":"waiting"}`), false)
	if a, _ := one(t, ix, "c"); a.State != StateWaiting || a.Waits != 1 {
		t.Fatalf("waiting: %+v", a)
	}
	ix.apply(Agents, "A", put("c", `{"agent_id":"c","status":"active","paused_at":"2026-01-02T03:04:05Z"}`), false)
	if a, _ := one(t, ix, "c"); a.State != StatePaused {
		t.Fatalf("paused: %+v", a)
	}
	ix.apply(Agents, "A", put("c", `{"agent_id":"c","status":"stopped"}`), false)
	if a, _ := one(t, ix, "c"); a.State != StateStopped {
		t.Fatalf("stopped: %+v", a)
	}
	// The buffer of 2 is full: more changes mark it lost, and wake it.
	if !sub.Lost() {
		t.Fatal("a full buffer lost nothing")
	}
	select {
	case <-sub.Wake:
	default:
		t.Fatal("no wake")
	}
	if sub.Lost() {
		t.Fatal("Lost did not clear")
	}
}

// TestOpenQuestions: oldest first across agents, a page at a time after
// the last one's cursor; an answered one leaves.
func TestOpenQuestions(t *testing.T) {
	ix := New(nil, Buckets{}, nil)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, k := range []string{"z.q1", "a.q2", "m.q3"} {
		agent := k[:1]
		ix.apply(Questions, "Q", put(k, fmt.Sprintf(`{"agent_id":%q,"status":"open","created_at":%q}`, agent, at.Add(time.Duration(i)*time.Minute).Format(time.RFC3339))), false)
	}
	page, more, total := ix.OpenQuestions(nil, 2)
	if len(page) != 2 || page[0].ID != "q1" || page[1].ID != "q2" || !more || total != 3 {
		t.Fatalf("first page: %+v %v %d", page, more, total)
	}
	page, more, _ = ix.OpenQuestions(&page[1], 2)
	if len(page) != 1 || page[0].ID != "q3" || page[0].AgentID != "m" || more {
		t.Fatalf("second page: %+v %v", page, more)
	}
	ix.apply(Questions, "Q", put("z.q1", `{"agent_id":"z","status":"answered"}`), false)
	if page, _, total = ix.OpenQuestions(nil, 10); len(page) != 2 || total != 2 || page[0].ID != "q2" {
		t.Fatalf("after an answer: %+v %d", page, total)
	}
}

// BenchmarkList reads a page of 100 from a fleet of 10,000 agents, each
// with an active timer and a finished task: the cost of GET /api/fleet
// on the server (no storage read).
func BenchmarkList(b *testing.B) {
	ix := New(nil, Buckets{}, nil)
	for i := range 10000 {
		id := fmt.Sprintf("agent-%05d", i)
		ix.apply(Timers, "T", put(id+".t", `{"agent_id":"`+id+`","status":"active"}`), true)
		ix.apply(Tasks, "K", put(id+".k", `{"agent_id":"`+id+`","status":"completed"}`), true)
	}
	for b.Loop() {
		if p := ix.List(Query{Limit: 100, Search: "agent-0"}); len(p.Agents) != 100 || p.Total != 10000 {
			b.Fatalf("%d agents of %d", len(p.Agents), p.Total)
		}
	}
}

// TestNotificationsCleared: a clear (the agent's guid record with reset
// 0) drops every notification the agent had, which the stream purge
// removes unseen; a compaction's guid (reset > 0) drops none.
func TestNotificationsCleared(t *testing.T) {
	ix := New(nil, Buckets{}, nil)
	ix.apply(Notifications, "N", put("n.a", `{"agent_id":"n","read":false}`), false)
	ix.apply(Notifications, "N", put("n.b", `{"agent_id":"n","read":true}`), false)
	ix.apply(Timers, "T", put("n.t", `{"agent_id":"n","status":"active"}`), false)
	ix.apply(Notifications, "N", put("n", `{"guid":"g1","reset":7}`), false)
	if a, _ := one(t, ix, "n"); a.Unread != 1 {
		t.Fatalf("after a compaction: %+v", a)
	}
	ix.apply(Notifications, "N", put("n", `{"guid":"g2"}`), false)
	if a, ok := one(t, ix, "n"); !ok || a.Unread != 0 || a.Timers != 1 {
		t.Fatalf("after a clear: %+v %v", a, ok)
	}
	ix.apply(Timers, "T", del("n.t"), false)
	if _, ok := one(t, ix, "n"); ok {
		t.Fatal("listed with no record: the cleared notifications still count")
	}
}
