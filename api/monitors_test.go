package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/deliveries"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/monitors"
	"github.com/chime-nats/chime/subjects"
)

// fetchKind reads an agent's deliveries of kind, in order, over inbox.fetch.
func fetchKind(t *testing.T, c *client.Client, kind string) []subjects.Envelope {
	t.Helper()
	var reply deliveries.InboxFetchReply
	if err := c.Request(context.Background(), "inbox.fetch", []byte(`{"max":100}`), &reply); err != nil {
		t.Fatal(err)
	}
	var out []subjects.Envelope
	for _, d := range reply.Deliveries {
		var env subjects.Envelope
		if err := json.Unmarshal(d.Envelope, &env); err != nil {
			t.Fatal(err)
		}
		if env.Kind == kind {
			out = append(out, env)
		}
	}
	return out
}

// TestMonitorsOverNATS: start, get, list and stop over NATS; the stop is
// delivered once as monitor_stopped; bad input is refused with its code
// and stores nothing; the per-agent limit holds; another agent sees none.
func TestMonitorsOverNATS(t *testing.T) {
	_, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.MaxMonitors = 2 })
	ctx := context.Background()
	c, err := client.New(nc, "agent-m")
	if err != nil {
		t.Fatal(err)
	}
	var m monitors.Monitor
	if err := c.Request(ctx, monitors.ActionStart, []byte(`{"description":"CI log","command":"make test","match":"FAIL"}`), &m); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.ID, "mon_") || m.Status != monitors.Running || m.TimeoutMS != 300000 || m.ExpiresAt == nil ||
		m.Source != (monitors.Source{Type: "command", Value: "make test"}) {
		t.Fatalf("start: %+v", m)
	}
	var again monitors.Monitor
	if err := c.Request(ctx, monitors.ActionStart, []byte(`{"description":"p","command":"tail -f x","persistent":true,"monitor_id":"tail"}`), &again); err != nil ||
		!again.Persistent || again.ExpiresAt != nil {
		t.Fatalf("persistent start: %+v %v", again, err)
	}
	// The limit: two are running.
	err = c.Request(ctx, monitors.ActionStart, []byte(`{"description":"third","command":"x"}`), &struct{}{})
	var wire *subjects.Error
	if !errors.As(err, &wire) || wire.Code != subjects.CodeQuotaExceeded || !strings.Contains(wire.Message, "CHIME_MAX_MONITORS_PER_AGENT") {
		t.Fatalf("third start: %v", err)
	}
	// A retry of a named start is answered, the limit notwithstanding.
	if err := c.Request(ctx, monitors.ActionStart, []byte(`{"description":"p","command":"tail -f x","persistent":true,"monitor_id":"tail"}`), &again); err != nil || again.ID != "tail" {
		t.Fatalf("retried start: %+v %v", again, err)
	}
	// Lines over NATS: one monitor_event a batch, the match applied.
	var r monitors.EmitReply
	if err := c.Request(ctx, monitors.ActionEmit, []byte(`{"monitor_id":"`+m.ID+`","seq":0,"lines":["ok 1","FAIL 2"]}`), &r); err != nil || r.Delivered != 1 || r.Filtered != 1 {
		t.Fatalf("emit: %+v %v", r, err)
	}
	if evs := fetchKind(t, c, subjects.KindMonitorEvent); len(evs) != 1 || evs[0].Text != "Monitor "+m.ID+" (CI log):\nFAIL 2" {
		t.Fatalf("monitor_event: %+v", evs)
	}
	var stopped monitors.Monitor
	for range 2 { // the second stop answers the record as it is
		if err := c.Request(ctx, monitors.ActionStop, []byte(`{"monitor_id":"tail"}`), &stopped); err != nil ||
			stopped.Status != monitors.Stopped || stopped.StopReason != monitors.ReasonStopped || stopped.DeliveredAt == nil {
			t.Fatalf("stop: %+v %v", stopped, err)
		}
	}
	var ended monitors.Monitor
	if err := c.Request(ctx, monitors.ActionStop, []byte(`{"monitor_id":"`+m.ID+`","exit_code":3}`), &ended); err != nil ||
		ended.StopReason != monitors.ReasonSourceEnded || ended.ExitCode == nil || *ended.ExitCode != 3 {
		t.Fatalf("source ended: %+v %v", ended, err)
	}
	envs := fetchKind(t, c, subjects.KindMonitorStopped)
	if len(envs) != 2 || envs[0].ID != "monitor_tail_stopped" || envs[0].Trust != subjects.TrustSystem ||
		!strings.Contains(envs[0].Text, "(p) stopped: it was stopped") || !strings.Contains(envs[1].Text, "exit code 3") {
		t.Fatalf("monitor_stopped deliveries: %+v", envs)
	}
	var list monitors.ListReply
	if err := c.Request(ctx, monitors.ActionList, nil, &list); err != nil || len(list.Monitors) != 2 {
		t.Fatalf("list: %+v %v", list, err)
	}
	var got monitors.Monitor
	if err := c.Request(ctx, monitors.ActionGet, []byte(`{"monitor_id":"tail"}`), &got); err != nil || got.Status != monitors.Stopped {
		t.Fatalf("get: %+v %v", got, err)
	}

	other, _ := client.New(nc, "agent-n")
	for _, tc := range []struct {
		c                        *client.Client
		action, body, code, text string
	}{
		{c, monitors.ActionStart, `{"command":"x"}`, subjects.CodeInvalidRequest, "description is required"},
		{c, monitors.ActionStart, `{"description":" ","command":"x"}`, subjects.CodeInvalidRequest, "description is required"},
		{c, monitors.ActionStart, `{"description":"a\nb","command":"x"}`, subjects.CodeInvalidRequest, "one line"},
		{c, monitors.ActionStart, `{"description":"` + strings.Repeat("d", 201) + `","command":"x"}`, subjects.CodeInvalidRequest, "at most 200 characters"},
		{c, monitors.ActionStart, `{"description":"d"}`, subjects.CodeInvalidRequest, "a source is required"},
		{c, monitors.ActionStart, `{"description":"d","command":"x","subject":"a.b"}`, subjects.CodeInvalidRequest, "one source only, not command and subject"},
		{c, monitors.ActionStart, `{"description":"d","subject":"a.b"}`, monitors.CodeSubjectNotAllowed, "CHIME_MONITOR_SUBJECTS is empty"},
		{c, monitors.ActionStart, `{"description":"d","kv":"builds/k"}`, monitors.CodeKVNotAllowed, "CHIME_MONITOR_KV is empty"},
		{c, monitors.ActionStart, `{"description":"d","kv":"chime_tokens/>"}`, monitors.CodeKVNotAllowed, "chime's own"},
		{c, monitors.ActionStart, `{"description":"d","ws":"wss://x"}`, monitors.CodeURLNotAllowed, "CHIME_MONITOR_URLS is empty"},
		{c, monitors.ActionStart, `{"description":"d","http":"https://x/"}`, monitors.CodeURLNotAllowed, "CHIME_MONITOR_URLS is empty"},
		{c, monitors.ActionStart, `{"description":"d","http":"https://x/","interval_ms":1000}`, subjects.CodeInvalidRequest, "interval_ms must be at least 30000"},
		{c, monitors.ActionStart, `{"description":"d","command":"x","match":"("}`, subjects.CodeInvalidRequest, "match is not a valid regular expression"},
		{c, monitors.ActionStart, `{"description":"d","command":"x","exclude":"[z-a]"}`, subjects.CodeInvalidRequest, "exclude is not a valid regular expression"},
		{c, monitors.ActionStart, `{"description":"d","command":"x","timeout_ms":3600001}`, subjects.CodeInvalidRequest, "timeout_ms is too large: at most 3600000"},
		{c, monitors.ActionStart, `{"description":"d","command":"x","timeout_ms":0}`, subjects.CodeInvalidRequest, "timeout_ms must be a positive integer"},
		{c, monitors.ActionStart, `{"description":"d","command":"x","timeout_ms":1000,"persistent":true}`, subjects.CodeInvalidRequest, "timeout_ms and persistent are exclusive"},
		{c, monitors.ActionStart, `{"description":"d","command":"x","max_events":-1}`, subjects.CodeInvalidRequest, "max_events must be a positive integer"},
		{c, monitors.ActionStart, `{"description":"d","command":"x","idle_timeout_ms":"5"}`, subjects.CodeInvalidRequest, "idle_timeout_ms"},
		{c, monitors.ActionStart, `{"description":"d","command":"x","monitor_id":"a.b"}`, subjects.CodeInvalidID, "monitor_id"},
		{c, monitors.ActionStart, `{"description":"d","command":"x","every":1}`, subjects.CodeInvalidRequest, `unknown field "every"`},
		{c, monitors.ActionEmit, `{"monitor_id":"tail","seq":0,"lines":["x"]}`, monitors.CodeMonitorStopped, "monitor tail stopped (stopped)"},
		{c, monitors.ActionEmit, `{"monitor_id":"tail","lines":["x"]}`, subjects.CodeInvalidRequest, "seq is required"},
		{c, monitors.ActionEmit, `{"monitor_id":"tail","seq":0,"lines":[]}`, subjects.CodeInvalidRequest, "lines must not be empty"},
		{c, monitors.ActionEmit, `{"monitor_id":"tail","seq":0,"lines":["` + strings.Repeat(`x","`, 100) + `x"]}`, subjects.CodeInvalidRequest, "lines must be at most 100 a batch, not 101"},
		{c, monitors.ActionEmit, `{"monitor_id":"tail","seq":0,"lines":["` + strings.Repeat("x", 300<<10) + `"]}`, subjects.CodePayloadTooLarge, ""},
		{c, monitors.ActionStop, `{}`, subjects.CodeInvalidID, "monitor_id must not be empty"},
		{c, monitors.ActionGet, `{"monitor_id":"nope"}`, monitors.CodeMonitorNotFound, "monitor nope not found"},
		{other, monitors.ActionGet, `{"monitor_id":"tail"}`, monitors.CodeMonitorNotFound, "monitor tail not found"},
		{other, monitors.ActionStop, `{"monitor_id":"tail"}`, monitors.CodeMonitorNotFound, "monitor tail not found"},
	} {
		err := tc.c.Request(ctx, tc.action, []byte(tc.body), &struct{}{})
		if !errors.As(err, &wire) || wire.Code != tc.code || !strings.Contains(wire.Message, tc.text) {
			t.Errorf("%s %.80s: %v, want %s %q", tc.action, tc.body, err, tc.code, tc.text)
		}
	}
	if err := c.Request(ctx, monitors.ActionList, nil, &list); err != nil || len(list.Monitors) != 2 {
		t.Fatalf("a refusal stored something: %+v %v", list, err)
	}
	if err := other.Request(ctx, monitors.ActionList, nil, &list); err != nil || len(list.Monitors) != 0 {
		t.Fatalf("another agent's list: %+v %v", list, err)
	}
}

// TestSubjectMonitorOverNATS: with CHIME_MONITOR_SUBJECTS open, an agent's
// subject monitor, run on the replica holding its shard, delivers what is
// published there; another agent's inbox and chime's subjects are refused.
func TestSubjectMonitorOverNATS(t *testing.T) {
	_, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.MonitorSubjects = "ci.>,team.{agent}.>" })
	ctx := context.Background()
	c, err := client.New(nc, "agent-s")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ subject, text string }{
		{"agent.agent-t.inbox", "overlaps agent.>"},
		{"team.agent-t.>", "not within"},
		{"$JS.API.>", "first token"},
		{"_INBOX.>", "first token"},
	} {
		err := c.Request(ctx, monitors.ActionStart, []byte(`{"description":"d","subject":"`+tc.subject+`"}`), &struct{}{})
		var wire *subjects.Error
		if !errors.As(err, &wire) || wire.Code != monitors.CodeSubjectNotAllowed || !strings.Contains(wire.Message, tc.text) {
			t.Errorf("%s: %v", tc.subject, err)
		}
	}
	var m monitors.Monitor
	if err := c.Request(ctx, monitors.ActionStart, []byte(`{"description":"team","subject":"team.agent-s.>","exclude":"noise"}`), &m); err != nil {
		t.Fatal(err)
	}
	err = c.Request(ctx, monitors.ActionEmit, []byte(`{"monitor_id":"`+m.ID+`","seq":0,"lines":["forged"]}`), &struct{}{})
	var wire *subjects.Error
	if !errors.As(err, &wire) || wire.Code != subjects.CodeInvalidRequest || !strings.Contains(wire.Message, "monitor.emit is for command monitors") {
		t.Fatalf("an emit into a subject monitor: %v", err)
	}
	testwait.Eventually(t, 10*time.Second, func() bool {
		if err := nc.Publish("team.agent-s.deploy", []byte("noise")); err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish("team.agent-s.deploy", []byte("deployed v2")); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
		for _, env := range fetchKind(t, c, subjects.KindMonitorEvent) {
			if strings.Contains(env.Text, "team.agent-s.deploy deployed v2") && !strings.Contains(env.Text, "noise") {
				return true
			}
		}
		return false
	}, "a published message as a monitor_event")
}

// TestMonitorTimeoutOnAReplica: the replica's sweep stops a monitor past
// its timeout and one idle past its idle timeout, each with its
// monitor_stopped, once.
func TestMonitorTimeoutOnAReplica(t *testing.T) {
	_, nc := startChime(t)
	ctx := context.Background()
	c, err := client.New(nc, "agent-o")
	if err != nil {
		t.Fatal(err)
	}
	var timed, idle monitors.Monitor
	if err := c.Request(ctx, monitors.ActionStart, []byte(`{"description":"short","command":"x","timeout_ms":300}`), &timed); err != nil {
		t.Fatal(err)
	}
	if err := c.Request(ctx, monitors.ActionStart, []byte(`{"description":"quiet","command":"x","persistent":true,"idle_timeout_ms":300}`), &idle); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, func() bool { return len(fetchKind(t, c, subjects.KindMonitorStopped)) == 2 }, "both stopped")
	for id, reason := range map[string]string{timed.ID: monitors.ReasonTimeout, idle.ID: monitors.ReasonIdleTimeout} {
		var m monitors.Monitor
		if err := c.Request(ctx, monitors.ActionGet, []byte(`{"monitor_id":"`+id+`"}`), &m); err != nil || m.StopReason != reason || m.DeliveredAt == nil {
			t.Fatalf("%s: %+v %v", id, m, err)
		}
	}
}

// TestInboxBySource: ?source=monitor:<id> limits the recent deliveries to
// that monitor's envelopes (its events and its ending), newest first,
// among the agent's others and another monitor's.
func TestInboxBySource(t *testing.T) {
	r, nc := startChime(t)
	base := "http://" + r.HTTPAddr()
	ctx := context.Background()
	c, _ := client.New(nc, "src")
	var a, b monitors.Monitor
	if err := c.Request(ctx, monitors.ActionStart, []byte(`{"description":"a","command":"a","monitor_id":"mon-a"}`), &a); err != nil {
		t.Fatal(err)
	}
	if err := c.Request(ctx, monitors.ActionStart, []byte(`{"description":"b","command":"b","monitor_id":"mon-b"}`), &b); err != nil {
		t.Fatal(err)
	}
	emit := func(id string, seq int, line string) {
		t.Helper()
		var er monitors.EmitReply
		body := `{"monitor_id":"` + id + `","seq":` + strconv.Itoa(seq) + `,"lines":["` + line + `"]}`
		if err := c.Request(ctx, monitors.ActionEmit, []byte(body), &er); err != nil || er.Delivered != 1 {
			t.Fatalf("emit %s: %+v %v", body, er, err)
		}
	}
	emit("mon-a", 0, "a0")
	emit("mon-b", 0, "b0")
	if _, err := c.CreateTimer(ctx, 10, 0, "tick"); err != nil {
		t.Fatal(err)
	}
	emit("mon-a", 1, "a1")
	emit("mon-b", 1, "b1")
	if err := c.Request(ctx, monitors.ActionStop, []byte(`{"monitor_id":"mon-a"}`), &a); err != nil {
		t.Fatal(err)
	}
	ids := func(q string) (int, []string) {
		status, body := get(t, base+"/api/agents/src/inbox?"+q)
		var page deliveries.Page
		if status != 200 || json.Unmarshal(body, &page) != nil {
			t.Fatalf("%s: %d %s", q, status, body)
		}
		out := []string{}
		for _, d := range page.Deliveries {
			var env subjects.Envelope
			if err := json.Unmarshal(d.Envelope, &env); err != nil {
				t.Fatal(err)
			}
			out = append(out, env.ID)
		}
		return len(page.Deliveries), out
	}
	testwait.Eventually(t, 5*time.Second, func() bool { n, _ := ids("limit=10"); return n == 6 }) // with the timer's fire
	for q, want := range map[string]string{
		"source=monitor:mon-a":         "[monitor_mon-a_stopped monitor_mon-a_1 monitor_mon-a_0]",
		"source=monitor:mon-a&limit=2": "[monitor_mon-a_stopped monitor_mon-a_1]",
		"source=monitor:mon-b":         "[monitor_mon-b_1 monitor_mon-b_0]",
		"source=monitor:nope":          "[]",
		"source=task:mon-a":            "[]",
	} {
		if _, got := ids(q); fmt.Sprint(got) != want {
			t.Errorf("%s: %v, want %s", q, got, want)
		}
	}
}
