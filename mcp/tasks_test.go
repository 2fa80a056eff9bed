package mcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/internal/testlog"
	"github.com/chime-nats/chime/mcp"
)

// TestToolsAndTimer: discover and list the tools (schemas from the
// prompts), create a timer and read its fire from the inbox, all through
// the go-sdk client with an agent token.
func TestToolsAndTimer(t *testing.T) {
	c := startChime(t)
	token := issueToken(t, c.nats(t), "ana")
	cs, _ := connect(t, c, "ana", token, false)
	if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
		t.Errorf("negotiated %s", v)
	}
	tools := map[string]*sdk.Tool{}
	for tool, err := range cs.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		tools[tool.Name] = tool
	}
	for _, name := range []string{"timer_create", "timer_get", "timer_pause", "timer_next", "wait", "wait_for", "wait_for_tasks", "wait_report",
		"task_start", "task_result", "task_get", "task_output", "question_ask", "notify_user", "inbox_fetch", "inbox_ack"} {
		if tools[name] == nil {
			t.Errorf("no tool %s", name)
		}
	}
	for _, name := range []string{"intervention", "question_answer", "token_issue", "lifecycle_stop"} {
		if tools[name] != nil {
			t.Errorf("operator action %s offered as an agent's tool", name)
		}
	}
	schema, _ := json.Marshal(tools["timer_create"].InputSchema)
	// duration_ms or cron: one of the two, so neither is required alone.
	if strings.Contains(string(schema), `"required"`) || !strings.Contains(string(schema), `"cron":`) || strings.Contains(string(schema), "timer_id") {
		t.Errorf("timer_create schema: %s", schema)
	}
	schema, _ = json.Marshal(tools["wait_for"].InputSchema)
	if !strings.Contains(string(schema), `"enum":["operator_input","task_result","external","timer","system","monitor"]`) {
		t.Errorf("wait_for schema: %s", schema)
	}

	res := call(t, cs, "timer_create", map[string]any{"duration_ms": 200, "summary": "stretch"})
	if res.IsError || !strings.Contains(text(res), `"status":"active"`) {
		t.Fatalf("timer_create: %s", text(res))
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		res = call(t, cs, "inbox_fetch", map[string]any{"wait_ms": 2000})
		if strings.Contains(text(res), `"kind":"timer_fired"`) && strings.Contains(text(res), "stretch") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no timer_fired in the inbox: %s", text(res))
		}
	}

	// Bad input is a tool error the model can read, with chime's code.
	res = call(t, cs, "timer_create", map[string]any{"duration_ms": -5})
	if !res.IsError || !strings.HasPrefix(text(res), "invalid_request: duration_ms") {
		t.Errorf("a negative duration: %v %s", res.IsError, text(res))
	}
	res = call(t, cs, "timer_get", map[string]any{"timer_id": "nope"})
	if !res.IsError || !strings.HasPrefix(text(res), "timer_not_found:") {
		t.Errorf("an unknown timer: %v %s", res.IsError, text(res))
	}
}

// TestWaitTask: a wait is a task for a client that declares the extension;
// tasks/get follows it to completed with the inbox's words; an unknown
// task, and another agent's, are -32602.
func TestWaitTask(t *testing.T) {
	c := startChime(t)
	nc := c.nats(t)
	cs, rec := connect(t, c, "bo", issueToken(t, nc, "bo"), true)
	res := call(t, cs, "wait", map[string]any{"seconds": 1})
	if res.IsError {
		t.Fatalf("wait: %s", text(res))
	}
	tk := rec.lastTask(t)
	if tk.Status != "working" || !strings.HasPrefix(tk.TaskID, "mcpt_") || tk.TTLMs == nil || *tk.TTLMs != time.Hour.Milliseconds() || tk.PollIntervalMs <= 0 {
		t.Fatalf("the task returned: %+v", tk)
	}
	done := pollTask(t, cs, tk.TaskID, "completed")
	if done.Result == nil || !strings.HasPrefix(text(done.Result), "Wait complete. Reached ") || done.ResultType != "complete" {
		t.Fatalf("completed: %+v", done)
	}

	_, err := getTask(t, cs, "mcpt_unknown")
	if e, ok := errors.AsType[*jsonrpc.Error](err); !ok || e.Code != jsonrpc.CodeInvalidParams {
		t.Errorf("an unknown task: %v", err)
	}
	other, _ := connect(t, c, "cy", issueToken(t, nc, "cy"), true)
	_, err = getTask(t, other, tk.TaskID)
	if e, ok := errors.AsType[*jsonrpc.Error](err); !ok || e.Code != jsonrpc.CodeInvalidParams {
		t.Errorf("another agent's task: %v", err)
	}
}

// TestTaskCancelAndRestart: a task is found after the replica restarts on
// its data, and tasks/cancel cancels the wait it stands for.
func TestTaskCancelAndRestart(t *testing.T) {
	c := startChime(t)
	token := issueToken(t, c.nats(t), "di")
	cs, rec := connect(t, c, "di", token, true)
	call(t, cs, "wait", map[string]any{"hours": 1})
	tk := rec.lastTask(t)

	c.restart()
	cs, _ = connect(t, c, "di", token, true)
	got := pollTask(t, cs, tk.TaskID, "working")
	if !strings.Contains(got.StatusMessage, "waiting until") {
		t.Errorf("after a restart: %+v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := sdk.CallCustomMethod[*taskParams, *ack](ctx, cs, "tasks/cancel", &taskParams{TaskID: tk.TaskID}); err != nil {
		t.Fatal(err)
	}
	pollTask(t, cs, tk.TaskID, "cancelled")
	list, err := mustClient(t, c, "di").ListWaits(ctx, 10)
	if err != nil || len(list.Waits) != 1 || list.Waits[0].Status != "cancelled" {
		t.Errorf("the wait after the task's cancel: %+v %v", list, err)
	}
}

func mustClient(t *testing.T, c *chime, agentID string) *client.Client {
	t.Helper()
	cl, err := client.New(c.nats(t), agentID)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// TestQuestionTask: a question is input_required with a form; answered by
// tasks/update it completes with the answer's words. Another, answered on
// the operator's HTTP route, completes the same way.
func TestQuestionTask(t *testing.T) {
	c := startChime(t)
	cs, rec := connect(t, c, "ed", issueToken(t, c.nats(t), "ed"), true)
	call(t, cs, "question_ask", map[string]any{"questions": []any{map[string]any{"title": "Deploy?", "options": []string{"yes", "no"}}}})
	tk := pollTask(t, cs, rec.lastTask(t).TaskID, "input_required")
	form := string(tk.InputRequests["answers"])
	if !strings.Contains(form, `"method":"elicitation/create"`) || !strings.Contains(form, `"enum":["yes","no"]`) {
		t.Fatalf("the form: %s", form)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	update := func(id string, answer any) error {
		_, err := sdk.CallCustomMethod[*updateParams, *ack](ctx, cs, "tasks/update", &updateParams{TaskID: id,
			InputResponses: map[string]any{"answers": map[string]any{"action": "accept", "content": map[string]any{"answer_1": answer}}}})
		return err
	}
	if err := update(tk.TaskID, "maybe"); err == nil {
		t.Error("an answer not among the options was taken")
	}
	if err := update(tk.TaskID, "yes"); err != nil {
		t.Fatal(err)
	}
	done := pollTask(t, cs, tk.TaskID, "completed")
	if !strings.Contains(text(done.Result), "Answer: yes") {
		t.Errorf("answered: %s", text(done.Result))
	}

	call(t, cs, "question_ask", map[string]any{"questions": []any{map[string]any{"title": "Why?"}}})
	asked := rec.lastTask(t)
	var q struct {
		QuestionID string `json:"question_id"`
	}
	// The operator answers on HTTP, as the console does.
	list := call(t, cs, "question_list", nil)
	var open struct {
		Questions []struct {
			ID string `json:"id"`
		} `json:"questions"`
	}
	if err := json.Unmarshal([]byte(text(list)), &open); err != nil || len(open.Questions) != 1 {
		t.Fatalf("open questions: %s", text(list))
	}
	q.QuestionID = open.Questions[0].ID
	req, _ := http.NewRequest(http.MethodPost, "http://"+c.r.HTTPAddr()+"/api/control/agents/ed/questions/"+q.QuestionID+"/answer",
		strings.NewReader(`{"answer":"because"}`))
	req.Header.Set("Authorization", "Bearer "+operator)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the operator's answer: %v %v", resp, err)
	}
	resp.Body.Close()
	done = pollTask(t, cs, asked.TaskID, "completed")
	if !strings.Contains(text(done.Result), "Answer: because") {
		t.Errorf("answered on HTTP: %s", text(done.Result))
	}
	// A late answer from the client is ignored: the question has its answer.
	if err := update(asked.TaskID, "too late"); err != nil {
		t.Errorf("a late answer: %v", err)
	}
}

// TestWithoutTasks: a client that does not declare the extension never
// gets a task: a short wait blocks and answers with its end.
func TestWithoutTasks(t *testing.T) {
	c := startChime(t)
	cs, _ := connect(t, c, "fa", issueToken(t, c.nats(t), "fa"), false)
	res := call(t, cs, "wait", map[string]any{"seconds": 1})
	if res.IsError || !strings.HasPrefix(text(res), "Wait complete. Reached ") {
		t.Fatalf("a blocking wait: %s", text(res))
	}
}

// TestMCPAuthorization: the agent's token opens only its own server; an
// operator's opens any; no token is 401.
func TestMCPAuthorization(t *testing.T) {
	c := startChime(t)
	token := issueToken(t, c.nats(t), "gu")
	post := func(agentID, tok string) int {
		req, _ := http.NewRequest(http.MethodPost, c.url(agentID), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		agent, token string
		want         int
	}{
		{"gu", token, http.StatusOK}, {"gu", operator, http.StatusOK}, {"other", operator, http.StatusOK},
		{"other", token, http.StatusForbidden}, {"gu", "", http.StatusUnauthorized}, {"gu", "wrong", http.StatusUnauthorized},
		{"bad..id", operator, http.StatusBadRequest},
	} {
		if got := post(tc.agent, tc.token); got != tc.want {
			t.Errorf("agent %s, token given %v: %d, want %d", tc.agent, tc.token != "", got, tc.want)
		}
	}
}

// TestStdio: chime mcp's proxy carries a go-sdk client over standard
// streams: discover, a wait as a task, tasks/get to completed.
func TestStdio(t *testing.T) {
	c := startChime(t)
	token := issueToken(t, c.nats(t), "ha")
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- (&mcp.Stdio{Endpoint: c.url("ha"), Token: token}).Run(ctx, inR, outW)
		outW.Close()
	}()
	t.Cleanup(func() {
		inW.Close()
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("stdio: %v", err)
		}
	})
	var seen lines
	caps := &sdk.ClientCapabilities{}
	caps.AddExtension(mcp.TasksExtension, nil)
	cl := sdk.NewClient(&sdk.Implementation{Name: "stdio-test", Version: "1"}, &sdk.ClientOptions{Capabilities: caps})
	if err := sdk.AddSendingCustomMethod[*taskParams, *task](cl, "tasks/get"); err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	cs, err := cl.Connect(cctx, &sdk.IOTransport{Reader: io.NopCloser(io.TeeReader(outR, &seen)), Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res := call(t, cs, "wait", map[string]any{"seconds": 1})
	if res.IsError {
		t.Fatalf("wait: %s", text(res))
	}
	id := seen.taskID(t)
	got := pollTask(t, cs, id, "completed")
	if !strings.HasPrefix(text(got.Result), "Wait complete.") {
		t.Errorf("over stdio: %+v", got)
	}
	// A bad token is a JSON-RPC error naming chime's refusal.
	bad := &mcp.Stdio{Endpoint: c.url("ha"), Token: "wrong"}
	var out strings.Builder
	if err := bad.Run(ctx, strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{}}`+"\n"), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"id":7`) || !strings.Contains(out.String(), "401") {
		t.Errorf("a refused token over stdio: %s", out.String())
	}
}

// lines keeps what a stream carried, for the test to read tasks from.
type lines struct{ testlog.Buffer }

func (l *lines) taskID(t *testing.T) string {
	t.Helper()
	for _, line := range strings.Split(l.String(), "\n") {
		var msg struct {
			Result task `json:"result"`
		}
		if json.Unmarshal([]byte(line), &msg) == nil && msg.Result.ResultType == "task" {
			return msg.Result.TaskID
		}
	}
	t.Fatal("no task carried")
	return ""
}

// TestTaskBound: an agent holds at most CHIME_MAX_MCP_TASKS_PER_AGENT
// tasks that go or ended unread; a refused call makes nothing; a task read
// ended no longer counts.
func TestTaskBound(t *testing.T) {
	c := startChimeWith(t, func(cfg *config.Config) { cfg.MaxMCPTasks = 2 })
	cs, rec := connect(t, c, "ik", issueToken(t, c.nats(t), "ik"), true)
	var ids []string
	for range 2 {
		call(t, cs, "wait", map[string]any{"hours": 1})
		ids = append(ids, rec.lastTask(t).TaskID)
	}
	res := call(t, cs, "wait", map[string]any{"hours": 1})
	if !res.IsError || !strings.HasPrefix(text(res), "quota_exceeded: agent ik holds 2 MCP tasks") {
		t.Fatalf("a third task: %v %s", res.IsError, text(res))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := mustClient(t, c, "ik").ListWaits(ctx, 10)
	if err != nil || len(list.Waits) != 2 {
		t.Fatalf("a refused task made a wait: %+v %v", list, err)
	}
	// Others are not held back by this agent's bound.
	other, _ := connect(t, c, "jo", issueToken(t, c.nats(t), "jo"), true)
	if res := call(t, other, "wait", map[string]any{"hours": 1}); res.IsError {
		t.Fatalf("another agent: %s", text(res))
	}
	// A cancelled task, once read, frees its place (its removal marker
	// counts for the marker TTL, a minute: the test sets no shorter one,
	// so it checks the move instead).
	if _, err := sdk.CallCustomMethod[*taskParams, *ack](ctx, cs, "tasks/cancel", &taskParams{TaskID: ids[0]}); err != nil {
		t.Fatal(err)
	}
	pollTask(t, cs, ids[0], "cancelled")
	js, err := jetstream.New(c.nats(t))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, "chime_mcp_tasks")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "live.ik."+ids[0]); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("a read task is still live: %v", err)
	}
	if _, err := kv.Get(ctx, "read.ik."+ids[0]); err != nil {
		t.Errorf("a read task is not kept as read: %v", err)
	}
	if _, err := kv.Get(ctx, "live.ik."+ids[1]); err != nil {
		t.Errorf("a going task is not live: %v", err)
	}
	again, err := getTask(t, cs, ids[0])
	if err != nil || again.Status != "cancelled" {
		t.Errorf("a read task read again: %+v %v", again, err)
	}
}

// TestBlockingBound: a blocking call holds one of the agent's event
// streams; past CHIME_MAX_STREAMS_PER_PRINCIPAL the receipt comes at once.
func TestBlockingBound(t *testing.T) {
	c := startChimeWith(t, func(cfg *config.Config) { cfg.MaxStreams = 1 })
	token := issueToken(t, c.nats(t), "lu")
	cs, _ := connect(t, c, "lu", token, false)
	// The agent's one stream, held by its notification feed.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.r.HTTPAddr()+"/api/agents/lu/notifications/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the feed: %v %v", resp, err)
	}
	defer resp.Body.Close()
	if _, err := resp.Body.Read(make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res := call(t, cs, "wait", map[string]any{"seconds": 30})
	if !strings.Contains(text(res), "is still going") || time.Since(start) > 10*time.Second {
		t.Fatalf("past the bound: %s after %v", text(res), time.Since(start))
	}
	cancel()
	resp.Body.Close()
	// With the feed closed, a call blocks again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if res := call(t, cs, "wait", map[string]any{"seconds": 1}); strings.HasPrefix(text(res), "Wait complete.") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a call does not block once the stream is free")
		}
	}
}
