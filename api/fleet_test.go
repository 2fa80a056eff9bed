package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/fleet"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/questions"
)

// fleetPage reads GET /api/fleet with query.
func fleetPage(t *testing.T, base, query string) fleet.Page {
	t.Helper()
	status, body := get(t, base+"/api/fleet"+query)
	var p fleet.Page
	if status != 200 || json.Unmarshal(body, &p) != nil {
		t.Fatalf("GET /api/fleet%s: %d %s", query, status, body)
	}
	return p
}

func byID(p fleet.Page) map[string]fleet.Agent {
	out := map[string]fleet.Agent{}
	for _, a := range p.Agents {
		out[a.AgentID] = a
	}
	return out
}

// TestFleetRoutes: the fleet lists every agent with a record (one with
// only a timer too) with its state and counts, filters by state and
// search, pages; the open questions across agents page and leave once
// answered; the event stream tells a new timer's count; bad parameters
// are 400 with a JSON error.
func TestFleetRoutes(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	ctx := context.Background()
	timerOnly, _ := client.New(nc, "timer-only")
	if _, err := timerOnly.CreateTimer(ctx, 600000, 0, "later"); err != nil {
		t.Fatal(err)
	}
	request(t, nc, "agent.waiter.wait.request", `{"seconds":600}`)
	asker, _ := client.New(nc, "asker")
	var asked []string
	for i := range 3 {
		a, err := asker.Ask(ctx, questions.QuestionItem{Title: fmt.Sprint("question ", i), Options: []string{"yes", "no"}})
		if err != nil {
			t.Fatal(err)
		}
		asked = append(asked, a.QuestionID)
	}
	request(t, nc, "agent.noter.notify", `{"message":"hello"}`)
	if status, body := post(t, base+"/api/control/agents/pauser/intervention", "application/json", []byte(`{"action":"pause"}`)); status != 200 {
		t.Fatalf("pause: %d %s", status, body)
	}
	var p fleet.Page
	testwait.Until(t, 5*time.Second, func() (bool, string) {
		p = fleetPage(t, base, "")
		a := byID(p)
		return a["timer-only"].Timers == 1 && a["waiter"].Waits == 1 && a["asker"].Questions == 3 && a["noter"].Unread == 1 && a["pauser"].State == fleet.StatePaused,
			fmt.Sprintf("%+v", p)
	}, "the fleet")
	a := byID(p)
	if p.Total != 5 || p.Matched != 5 || len(p.Agents) != 5 || a["waiter"].State != fleet.StateWaiting || a["timer-only"].State != fleet.StateActive ||
		p.States[fleet.StateWaiting] != 1 || p.States[fleet.StatePaused] != 1 || p.States[fleet.StateActive] != 3 || p.Seq == 0 {
		t.Fatalf("fleet: %+v", p)
	}
	if got := fleetPage(t, base, "?state=waiting"); len(got.Agents) != 1 || got.Agents[0].AgentID != "waiter" || got.Matched != 1 || got.Total != 5 {
		t.Fatalf("state=waiting: %+v", got)
	}
	if got := fleetPage(t, base, "?q=ER&state=active"); len(got.Agents) != 3 || got.Agents[0].AgentID != "asker" || got.Agents[2].AgentID != "timer-only" {
		t.Fatalf("q=ER&state=active (case-insensitive): %+v", got)
	}
	if got := fleetPage(t, base, "?q=waIT"); len(got.Agents) != 1 || got.Agents[0].AgentID != "waiter" {
		t.Fatalf("q=waIT: %+v", got)
	}
	first := fleetPage(t, base, "?limit=2")
	second := fleetPage(t, base, "?limit=2&cursor="+first.Next)
	third := fleetPage(t, base, "?limit=2&cursor="+second.Next)
	if len(first.Agents) != 2 || first.Agents[1].AgentID != "noter" || first.Next != "noter" ||
		len(second.Agents) != 2 || second.Agents[0].AgentID != "pauser" || len(third.Agents) != 1 || third.Agents[0].AgentID != "waiter" || third.Next != "" {
		t.Fatalf("pages: %+v / %+v / %+v", first, second, third)
	}

	// The open questions across agents, oldest first, a page at a time.
	var qs apiFleetQuestions
	status, body := get(t, base+"/api/fleet/questions?limit=2")
	if status != 200 || json.Unmarshal(body, &qs) != nil || len(qs.Questions) != 2 || qs.Questions[0].ID != asked[0] || qs.Total != 3 || qs.NextCursor == "" {
		t.Fatalf("questions: %d %s", status, body)
	}
	status, body = get(t, base+"/api/fleet/questions?limit=2&cursor="+url.QueryEscape(qs.NextCursor))
	qs = apiFleetQuestions{}
	if status != 200 || json.Unmarshal(body, &qs) != nil || len(qs.Questions) != 1 || qs.Questions[0].ID != asked[2] || qs.NextCursor != "" {
		t.Fatalf("questions, page 2: %d %s", status, body)
	}

	// Live: the stream tells each change, with the agent's counts.
	events := follow(t, base, "/api/fleet/events")
	if ev := nextSSE(t, events); ev.event != "hello" {
		t.Fatalf("first event: %+v", ev)
	}
	if _, err := timerOnly.CreateTimer(ctx, 600000, 0, "another"); err != nil {
		t.Fatal(err)
	}
	ev := nextSSE(t, events)
	var c fleet.Change
	if ev.event != "change" || json.Unmarshal([]byte(ev.data), &c) != nil || c.Kind != "timers" || c.Agent.AgentID != "timer-only" || c.Agent.Timers != 2 || ev.id != c.Seq || c.Seq <= p.Seq {
		t.Fatalf("change: %+v", ev)
	}
	if status, body := post(t, base+"/api/control/agents/asker/questions/"+asked[0]+"/answer", "application/json", []byte(`{"answer":"yes"}`)); status != 200 {
		t.Fatalf("answer: %d %s", status, body)
	}
	for c.Kind != "questions" {
		if ev = nextSSE(t, events); json.Unmarshal([]byte(ev.data), &c) != nil {
			t.Fatalf("event: %+v", ev)
		}
	}
	if c.Agent.Questions != 2 {
		t.Fatalf("after the answer: %+v", c)
	}
	status, body = get(t, base+"/api/fleet/questions")
	qs = apiFleetQuestions{}
	if status != 200 || json.Unmarshal(body, &qs) != nil || len(qs.Questions) != 2 || qs.Questions[0].ID != asked[1] || qs.Total != 2 {
		t.Fatalf("questions after the answer: %d %s", status, body)
	}

	// Bad input: 400, invalid_request, saying what is wrong.
	for _, tc := range []struct{ path, says string }{
		{"/api/fleet?limit=0", "limit must be a whole number from 1 to 500"},
		{"/api/fleet?limit=501", "limit must be"},
		{"/api/fleet?limit=ten", "limit must be"},
		{"/api/fleet?state=sleeping", "state must be one of active, paused, stopped, waiting"},
		{"/api/fleet?q=a*b", "q must be at most 64"},
		{"/api/fleet?q=" + strings.Repeat("a", 65), "q must be at most 64"},
		{"/api/fleet?cursor=a.b", "cursor must be an agent ID"},
		{"/api/fleet?stat=active", `unknown parameter "stat"`},
		{"/api/fleet?limit=1&limit=2", "limit is given 2 times"},
		{"/api/fleet/questions?cursor=nope", "cursor must be the next_cursor"},
		{"/api/fleet/questions?cursor=1.a.b.c", "cursor must be the next_cursor"},
		{"/api/fleet/questions?limit=-1", "limit must be"},
		{"/api/fleet/questions?state=open", `unknown parameter "state"`},
		{"/api/fleet/events?since=1", `unknown parameter "since"`},
	} {
		status, body := get(t, base+tc.path)
		var e struct {
			Error struct{ Code, Message string }
		}
		if status != 400 || json.Unmarshal(body, &e) != nil || e.Error.Code != "invalid_request" || !strings.Contains(e.Error.Message, tc.says) {
			t.Errorf("%s: %d %s, want 400 saying %q", tc.path, status, body, tc.says)
		}
	}
}

// apiFleetQuestions is GET /api/fleet/questions's reply.
type apiFleetQuestions struct {
	Questions  []questions.Question `json:"questions"`
	NextCursor string               `json:"next_cursor"`
	Total      int                  `json:"total"`
}

// TestFleetOperatorsOnly: with operator tokens, the fleet views need an
// operator's: none is 401, an agent's own token (even of an agent called
// "fleet") is 403, an operator's is 200.
func TestFleetOperatorsOnly(t *testing.T) {
	const operator = "operator-fleet-token"
	h := sha256.Sum256([]byte(operator))
	file := filepath.Join(t.TempDir(), "operators")
	if err := os.WriteFile(file, []byte(hex.EncodeToString(h[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.OperatorTokensFile = file })
	base := "http://" + r.HTTPAddr()
	c, _ := client.New(nc, "fleet")
	issued, err := c.IssueToken(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/api/fleet", "/api/fleet/questions", "/api/fleet/events"} {
		if status, body := get(t, base+path); status != 401 {
			t.Errorf("%s without a token: %d %s", path, status, body)
		}
		if status, body := get(t, base+path, "Authorization", "Bearer "+issued.Token); status != 403 {
			t.Errorf("%s with an agent's token: %d %s", path, status, body)
		}
	}
	if status, body := get(t, base+"/api/fleet", "Authorization", "Bearer "+operator); status != 200 {
		t.Errorf("/api/fleet as an operator: %d %s", status, body)
	}
}

// TestFleetSharded: in the sharded layout (timer keys carry their shard,
// the buckets a layout marker) the fleet counts an agent's timers from
// every partition; cancelled, they leave the buckets for the history
// stream, and the agent, with no record left, leaves the fleet. The
// marker is no agent's.
func TestFleetSharded(t *testing.T) {
	r, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.Partitions = 2 })
	base := "http://" + r.HTTPAddr()
	ctx := context.Background()
	c, _ := client.New(nc, "sharded")
	var ids []string
	for range 4 {
		tm, err := c.CreateTimer(ctx, 600000, 0, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tm.ID)
	}
	testwait.Until(t, 5*time.Second, func() (bool, string) {
		p := fleetPage(t, base, "")
		return p.Total == 1 && byID(p)["sharded"].Timers == 4, fmt.Sprintf("%+v", p)
	}, "4 active timers, one agent")
	for _, id := range ids {
		if _, err := c.CancelTimer(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	testwait.Until(t, 5*time.Second, func() (bool, string) {
		p := fleetPage(t, base, "")
		return p.Total == 0, fmt.Sprintf("%+v", p)
	}, "no agent with a record")
}
