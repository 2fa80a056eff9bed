package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/replica"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/timers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startChime runs a whole replica in-process on an embedded server.
func startChime(t *testing.T) (*replica.Replica, *nats.Conn) {
	t.Helper()
	return startChimeWith(t, io.Discard, nil)
}

// startChimeWith runs a replica logging (at debug) to logs, with its
// configuration adjusted by adjust.
func startChimeWith(t *testing.T, logs io.Writer, adjust func(*config.Config)) (*replica.Replica, *nats.Conn) {
	t.Helper()
	cfg := &config.Config{
		DataDir: t.TempDir(), NATSListen: "127.0.0.1:-1", JSReplicas: 1, HTTPAddr: "127.0.0.1:0",
		ReplicaID: "test", Shards: 8, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour,
		LogLevel: "debug", LogFormat: "text",
	}
	if adjust != nil {
		adjust(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := replica.Start(ctx, cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), "0.0.0-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Stop(context.Background()) })
	nc, err := nats.Connect(r.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return r, nc
}

func request(t *testing.T, nc *nats.Conn, subject, body string) *nats.Msg {
	t.Helper()
	msg, err := nc.Request(subject, []byte(body), 5*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", subject, err)
	}
	return msg
}

func TestNATSTimerLifecycle(t *testing.T) {
	_, nc := startChime(t)
	ctx := context.Background()
	c, err := client.New(nc, "agent-1")
	if err != nil {
		t.Fatal(err)
	}
	tm, err := c.CreateTimer(ctx, 60000, 0, "check CI")
	if err != nil {
		t.Fatal(err)
	}
	if tm.Status != timers.TimerActive || tm.DurationMs != 60000 || tm.IntervalMs != nil || tm.Repeat ||
		tm.Summary != "check CI" || tm.FireCount != 0 || tm.LastFiredAt != nil || tm.AgentID != "agent-1" {
		t.Fatalf("record: %+v", tm)
	}
	if got := tm.NextFireAt.Sub(tm.CreatedAt); got != 60*time.Second {
		t.Fatalf("next_fire_at - created_at = %v", got)
	}
	rep, err := c.CreateTimer(ctx, 1000, 500, "")
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Repeat || rep.IntervalMs == nil || *rep.IntervalMs != 500 {
		t.Fatalf("repeating record: %+v", rep)
	}
	list, err := c.ListTimers(ctx, 0)
	if err != nil || len(list) != 2 || list[0].ID != tm.ID || list[1].ID != rep.ID {
		t.Fatalf("list in the order of last change: %v %+v", err, list)
	}
	page, err := c.TimersPage(ctx, 1, "")
	if err != nil || len(page.Timers) != 1 || page.Timers[0].ID != tm.ID || page.NextCursor == "" {
		t.Fatalf("limit 1: %+v %v", page, err)
	}
	if page, err = c.TimersPage(ctx, 1, page.NextCursor); err != nil || len(page.Timers) != 1 || page.Timers[0].ID != rep.ID || page.NextCursor != "" {
		t.Fatalf("second and last page: %+v %v", page, err)
	}
	got, err := c.GetTimer(ctx, tm.ID)
	if err != nil || got.ID != tm.ID || got.Summary != "check CI" {
		t.Fatalf("get: %v %+v", err, got)
	}
	for range 2 { // the second cancel is a no-op
		got, err = c.CancelTimer(ctx, tm.ID)
		if err != nil || got.Status != timers.TimerCancelled || got.NextFireAt != nil {
			t.Fatalf("cancel: %v %+v", err, got)
		}
	}
	other, _ := client.New(nc, "agent-2")
	if _, err := other.GetTimer(ctx, rep.ID); !errors.Is(err, subjects.ErrTimerNotFound) || err.Error() != "timer_not_found: timer "+rep.ID+" not found" {
		t.Fatalf("another agent's timer: %v", err)
	}
	if _, err := other.CancelTimer(ctx, rep.ID); !errors.Is(err, subjects.ErrTimerNotFound) {
		t.Fatalf("cancel another agent's timer: %v", err)
	}
	if got, _ := c.GetTimer(ctx, rep.ID); got.Status != timers.TimerActive {
		t.Fatalf("another agent's cancel changed the timer: %+v", got)
	}
}

func TestCancelCompletedOneShot(t *testing.T) {
	_, nc := startChime(t)
	ctx := context.Background()
	c, _ := client.New(nc, "a")
	tm, err := c.CreateTimer(ctx, 50, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 5*time.Second, func() (bool, string) {
		got, err := c.GetTimer(ctx, tm.ID)
		return err == nil && got.Status == timers.TimerCompleted, fmt.Sprintf("%+v %v", got, err)
	}, "timer completed")
	_, err = c.CancelTimer(ctx, tm.ID)
	if !errors.Is(err, subjects.ErrTimerCompleted) || subjects.AsError(err).Message != "cannot cancel completed timer "+tm.ID {
		t.Fatalf("cancel completed: %v", err)
	}
	if got, _ := c.GetTimer(ctx, tm.ID); got.Status != timers.TimerCompleted || got.FireCount != 1 {
		t.Fatalf("record changed: %+v", got)
	}
}

// badInputs are create bodies rejected with their specific error; the same
// table runs over NATS and HTTP.
var badInputs = []struct {
	body, code, msg string
}{
	{`{"duration_ms":0}`, "invalid_request", "duration_ms must be a positive integer, not 0"},
	{`{"duration_ms":-1}`, "invalid_request", "duration_ms must be a positive integer, not -1"},
	{`{"duration_ms":2.5}`, "invalid_request", "duration_ms must be a positive integer, not 2.5"},
	{`{}`, "invalid_request", "duration_ms is required"},
	{`{"duration_ms":1e400}`, "invalid_request", "duration_ms is too large: at most 3153600000000"},
	{`{"duration_ms":18446744073709551616}`, "invalid_request", "duration_ms is too large: at most 3153600000000"},
	{`{"duration_ms":100,"interval_ms":0}`, "invalid_request", "interval_ms must be a positive integer, not 0"},
	{`{"duration_ms":100,"interval_ms":-3}`, "invalid_request", "interval_ms must be a positive integer, not -3"},
	{`{"duration_ms":100,"interval_ms":0.5}`, "invalid_request", "interval_ms must be a positive integer, not 0.5"},
	{`{"duration_ms":100,"interval_ms":99999999999999999999}`, "invalid_request", "interval_ms is too large: at most 3153600000000"},
	{`{"duration_ms":100,"color":"red"}`, "invalid_request", `unknown field "color"`},
	{`{"duration_ms":`, "invalid_json", ""},
	{`not json`, "invalid_json", "request body must be a JSON object"},
}

func TestNATSBadInput(t *testing.T) {
	_, nc := startChime(t)
	ctx := context.Background()
	c, _ := client.New(nc, "bad")
	keep, err := c.CreateTimer(ctx, 60000, 0, "keep")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range badInputs {
		msg := request(t, nc, "agent.bad.timer.create", in.body)
		assertError(t, in.body, msg.Data, in.code, in.msg)
		if msg.Header.Get("Nats-Service-Error-Code") != "400" || msg.Header.Get("Nats-Service-Error") == "" {
			t.Errorf("%s: micro error headers %v", in.body, msg.Header)
		}
	}
	refs := []struct{ subject, body, code, msg string }{
		{"agent.bad.timer.get", `{}`, "invalid_id", "timer_id must not be empty"},
		{"agent.bad.timer.get", `{"timer_id":"a.b"}`, "invalid_id", `timer_id "a.b" may only contain letters, digits, '_' and '-'`},
		{"agent.bad.timer.cancel", `{"timer_id":"nope"}`, "timer_not_found", "timer nope not found"},
		{"agent.bad.timer.get", `{"timer_id":"nope"}`, "timer_not_found", "timer nope not found"},
		{"agent.bad.timer.list", `{"limit":0}`, "invalid_request", "limit must be a positive integer, not 0"},
		{"agent.bad.timer.list", `{"limit":1001}`, "invalid_request", "limit is too large: at most 1000"},
		{"agent.bad.timer.list", `{"limit":"5"}`, "invalid_request", `limit must be a positive integer, not "5"`},
		{"agent.bad.timer.cancel", `{"timer_id":"x","extra":1}`, "invalid_request", `unknown field "extra"`},
		{"agent." + strings.Repeat("x", 65) + ".timer.create", `{"duration_ms":100}`, "invalid_id", "agent_id must be at most 64 characters"},
	}
	for _, r := range refs {
		assertError(t, r.subject+" "+r.body, request(t, nc, r.subject, r.body).Data, r.code, r.msg)
	}
	// IDs with '.', '*' or '>' cannot even form a served subject: nobody answers.
	for _, subj := range []string{"agent.a.b.timer.create", "agent..timer.create"} {
		if _, err := nc.Request(subj, []byte(`{"duration_ms":100}`), 500*time.Millisecond); !errors.Is(err, nats.ErrNoResponders) {
			t.Errorf("%s: %v, want no responders", subj, err)
		}
	}
	list, err := c.ListTimers(ctx, 0)
	if err != nil || len(list) != 1 || list[0].ID != keep.ID || list[0].Status != timers.TimerActive {
		t.Fatalf("stored state changed by bad input: %v %+v", err, list)
	}
}

func TestHTTPRoutes(t *testing.T) {
	r, _ := startChime(t)
	base := "http://" + r.HTTPAddr()
	do := func(method, path, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if ct := res.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: content type %q", method, path, ct)
		}
		return res.StatusCode, b
	}
	status, body := do("POST", "/api/control/agents/web/timers", `{"duration_ms":60000,"summary":"s","authority_class":"operator"}`)
	var tm timers.Timer
	if status != 201 || json.Unmarshal(body, &tm) != nil || tm.Status != timers.TimerActive || tm.AuthorityClass != "operator" {
		t.Fatalf("create: %d %s", status, body)
	}
	if status, body = do("GET", "/api/agents/web/timers/"+tm.ID, ""); status != 200 || !bytes.Contains(body, []byte(tm.ID)) {
		t.Fatalf("get: %d %s", status, body)
	}
	var list timers.ListTimersReply
	if status, body = do("GET", "/api/agents/web/timers?limit=5", ""); status != 200 || json.Unmarshal(body, &list) != nil || len(list.Timers) != 1 {
		t.Fatalf("list: %d %s", status, body)
	}
	for _, in := range badInputs {
		status, body := do("POST", "/api/control/agents/web/timers", in.body)
		if status != 400 {
			t.Errorf("%s: status %d", in.body, status)
		}
		assertError(t, in.body, body, in.code, in.msg)
	}
	errs := []struct {
		method, path string
		status       int
		code, msg    string
	}{
		{"GET", "/api/agents/web/timers/nope", 404, "timer_not_found", "timer nope not found"},
		{"GET", "/api/agents/other/timers/" + tm.ID, 404, "timer_not_found", "timer " + tm.ID + " not found"},
		{"POST", "/api/control/agents/web/timers/nope/cancel", 404, "timer_not_found", "timer nope not found"},
		{"GET", "/api/agents/web/timers?limit=abc", 400, "invalid_request", `limit must be a positive integer, not "abc"`},
		{"GET", "/api/agents/web/timers?limit=-2", 400, "invalid_request", "limit must be a positive integer, not -2"},
		{"GET", "/api/agents/a.b/timers", 400, "invalid_id", `agent_id "a.b" may only contain letters, digits, '_' and '-'`},
		{"GET", "/api/agents/%2A/timers", 400, "invalid_id", `agent_id "*" may only contain letters, digits, '_' and '-'`},
		{"GET", "/api/agents/%3E/timers", 400, "invalid_id", `agent_id ">" may only contain letters, digits, '_' and '-'`},
		{"GET", "/api/agents/a%20b/timers", 400, "invalid_id", `agent_id "a b" may only contain letters, digits, '_' and '-'`},
		{"GET", "/api/agents/" + strings.Repeat("x", 65) + "/timers", 400, "invalid_id", "agent_id must be at most 64 characters"},
		{"GET", "/api/agents/web/timers/a.b", 400, "invalid_id", `timer_id "a.b" may only contain letters, digits, '_' and '-'`},
	}
	for _, e := range errs {
		status, body := do(e.method, e.path, "")
		if status != e.status {
			t.Errorf("%s %s: status %d, want %d (%s)", e.method, e.path, status, e.status, body)
		}
		assertError(t, e.path, body, e.code, e.msg)
	}
	for range 2 {
		if status, body = do("POST", "/api/control/agents/web/timers/"+tm.ID+"/cancel", ""); status != 200 || !bytes.Contains(body, []byte(`"status":"cancelled"`)) {
			t.Fatalf("cancel: %d %s", status, body)
		}
	}
	if status, body = do("POST", "/api/control/agents/web/timers", `{"duration_ms":1,"summary":"`+strings.Repeat("x", 70<<10)+`"}`); status != 413 {
		t.Errorf("oversized body: %d %s", status, body)
	}
	if status, _ = do("GET", "/healthz", ""); status != 200 {
		t.Errorf("healthz %d", status)
	}
	if status, _ = do("GET", "/readyz", ""); status != 200 {
		t.Errorf("readyz %d", status)
	}
	if status, body = do("GET", "/api/agents/web/timers", ""); status != 200 || json.Unmarshal(body, &list) != nil || len(list.Timers) != 1 || list.Timers[0].Status != timers.TimerCancelled {
		t.Fatalf("stored state after bad input: %d %s", status, body)
	}
	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, name := range []string{"chime_timers_active", "chime_timer_fires_total", "chime_timer_fire_lateness_seconds", `chime_requests_total{endpoint="http:timer.create",outcome="invalid_request"}`, "chime_inbox_deliveries_total"} {
		if !bytes.Contains(metrics, []byte(name)) {
			t.Errorf("metrics lack %s", name)
		}
	}
}

func assertError(t *testing.T, what string, body []byte, code, msg string) {
	t.Helper()
	var reply subjects.ErrorReply
	if err := json.Unmarshal(body, &reply); err != nil || reply.Error == nil {
		t.Errorf("%.60s: not an error reply: %s", what, body)
		return
	}
	if reply.Error.Code != code || (msg != "" && reply.Error.Message != msg) {
		t.Errorf("%.60s: got %s %q, want %s %q", what, reply.Error.Code, reply.Error.Message, code, msg)
	}
}
