package api_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/internal/testlog"
	"github.com/chime-nats/chime/internal/testwait"
	"github.com/chime-nats/chime/notifications"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
	"github.com/chime-nats/chime/waitfor"
	"github.com/chime-nats/chime/waits"
)

// refusedOverNATS checks a NATS reply is the wire error code with text
// at its start, with the 429 service error header and, for a rate, a
// Retry-After.
func refusedOverNATS(t *testing.T, what string, msg []byte, header map[string][]string, code, text string) {
	t.Helper()
	e := subjects.AsError(subjects.DecodeReply(msg, &struct{}{}))
	if e.Code != code || !strings.HasPrefix(e.Message, text) {
		t.Errorf("%s: %s %q, want %s %q", what, e.Code, e.Message, code, text)
	}
	if got := first(header["Nats-Service-Error-Code"]); got != "429" {
		t.Errorf("%s: Nats-Service-Error-Code %q", what, got)
	}
	if after := first(header["Retry-After"]); (code == subjects.CodeRateLimited) != (after != "") {
		t.Errorf("%s: Retry-After %q", what, after)
	}
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// TestRunningTasksLimit: an agent at its running tasks is refused a new
// start over NATS, while a retry of a start it made is answered; a task
// that ends makes room; other agents are not touched.
func TestRunningTasksLimit(t *testing.T) {
	r, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.MaxRunningTasks = 2 })
	ctx := context.Background()
	c, _ := client.New(nc, "busy")
	for _, id := range []string{"t1", "t2"} {
		if _, err := c.StartTask(ctx, id, ""); err != nil {
			t.Fatal(err)
		}
	}
	// The index follows the bucket a few milliseconds behind, so a probe
	// may still be admitted: each probe has an ID of its own, and one
	// admitted is finished at once, so that it does not count.
	probes := 0
	refused := ""
	testwait.Eventually(t, 5*time.Second, func() bool {
		probes++
		id := fmt.Sprintf("probe%d", probes)
		msg := request(t, nc, "agent.busy.task.start", `{"task_id":"`+id+`"}`)
		if subjects.AsError(subjects.DecodeReply(msg.Data, &struct{}{})).Code == subjects.CodeQuotaExceeded {
			refused = id
			return true
		}
		if _, err := c.ReportResult(ctx, tasks.TaskResultRequest{TaskID: id, Status: tasks.TaskCompleted}); err != nil {
			t.Fatal(err)
		}
		return false
	})
	// Refused now (the index holds t1 and t2), and once it has seen an
	// admitted probe finish, at the count of the two.
	var msg *nats.Msg
	testwait.Eventually(t, 5*time.Second, func() bool {
		msg = request(t, nc, "agent.busy.task.start", `{}`)
		return strings.HasPrefix(subjects.AsError(subjects.DecodeReply(msg.Data, &struct{}{})).Message, "agent busy has 2 ")
	})
	refusedOverNATS(t, "3rd start", msg.Data, msg.Header, subjects.CodeQuotaExceeded,
		"agent busy has 2 running tasks; at most 2 are allowed (CHIME_MAX_RUNNING_TASKS_PER_AGENT)")
	if again, err := c.StartTask(ctx, "t1", ""); err != nil || again.ID != "t1" {
		t.Fatalf("a retried start at the limit: %+v %v", again, err)
	}
	if _, err := c.GetTask(ctx, refused); !errors.Is(err, tasks.ErrTaskNotFound) {
		t.Fatalf("the refused start stored a task: %v", err)
	}
	other, _ := client.New(nc, "calm")
	if _, err := other.StartTask(ctx, "", ""); err != nil {
		t.Fatalf("another agent: %v", err)
	}
	if _, err := c.ReportResult(ctx, tasks.TaskResultRequest{TaskID: "t1", Status: tasks.TaskCompleted}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 5*time.Second, func() bool {
		_, err := c.StartTask(ctx, "t3", "")
		return err == nil
	})
	if got := metric(t, r, `chime_quota_refusals_total{quota="running_tasks"}`); got < 2 {
		t.Errorf("running_tasks refusals: %v", got)
	}
}

// TestTaskStartRate: past its burst an agent's task starts, and results
// that would register new tasks, are refused rate_limited with
// Retry-After; reports on its tasks and other agents go on.
func TestTaskStartRate(t *testing.T) {
	// 0.01 a second: a burst of 1, and no token back while the test runs.
	var logs testlog.Buffer
	r, nc := startChimeWith(t, &logs, func(c *config.Config) { c.TaskStartRate = 0.01 })
	ctx := context.Background()
	c, _ := client.New(nc, "eager")
	if _, err := c.StartTask(ctx, "first", ""); err != nil {
		t.Fatal(err)
	}
	const text = "agent eager is starting tasks faster than 0.01 a second (CHIME_TASK_START_RATE); retry in "
	msg := request(t, nc, "agent.eager.task.start", `{"task_id":"second"}`)
	refusedOverNATS(t, "2nd start", msg.Data, msg.Header, subjects.CodeRateLimited, text)
	msg = request(t, nc, "agent.eager.task.result", `{"task_id":"unstarted","status":"completed"}`)
	refusedOverNATS(t, "a result registering a task", msg.Data, msg.Header, subjects.CodeRateLimited, text)
	if _, err := c.GetTask(ctx, "unstarted"); !errors.Is(err, tasks.ErrTaskNotFound) {
		t.Fatalf("the refused result stored a task: %v", err)
	}
	if _, err := c.ReportResult(ctx, tasks.TaskResultRequest{TaskID: "first", Status: tasks.TaskCompleted}); err != nil {
		t.Fatalf("the result of a started task: %v", err)
	}
	other, _ := client.New(nc, "calm")
	if _, err := other.StartTask(ctx, "", ""); err != nil {
		t.Fatalf("another agent: %v", err)
	}
	// A flood of refusals is counted, not logged.
	for range 200 {
		_ = c.Request(ctx, tasks.ActionTaskStart, []byte(`{}`), &struct{}{})
	}
	if got := metric(t, r, `chime_quota_refusals_total{quota="task_starts"}`); got != 202 {
		t.Errorf("task_starts refusals: %v, want 202", got)
	}
	if n := strings.Count(logs.String(), "eager"); n > 5 {
		t.Errorf("%d log lines name the flooding agent:\n%.2000s", n, logs.String())
	}
}

// TestTaskOutputBytesLimit: an agent at its stored output bytes is refused
// the next part and a large whole output, with nothing stored lost: its
// parts make the result and read back byte-exact. Other agents append.
func TestTaskOutputBytesLimit(t *testing.T) {
	const limit = 1 << 20
	r, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.MaxTaskOutputBytes = limit })
	ctx := context.Background()
	c, _ := client.New(nc, "writer")
	if _, err := c.StartTask(ctx, "big", ""); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, limit)
	for i := range want {
		want[i] = byte(i*7 + i>>9)
	}
	seq := int64(0)
	for off := 0; off < len(want); off += tasks.MaxAppendChunk {
		if _, err := c.AppendOutput(ctx, "big", seq, want[off:min(len(want), off+tasks.MaxAppendChunk)]); err != nil {
			t.Fatalf("append %d: %v", seq, err)
		}
		seq++
	}
	settledBytes := func() bool {
		tk, err := c.GetTask(ctx, "big")
		return err == nil && tk.AppendedBytes == limit
	}
	testwait.Eventually(t, 5*time.Second, settledBytes)
	const text = "agent writer stores 1048576 bytes of task output; 1 more would pass the 1048576 allowed (CHIME_MAX_TASK_OUTPUT_BYTES_PER_AGENT)"
	var msg []byte
	var header map[string][]string
	testwait.Eventually(t, 5*time.Second, func() bool { // the index counts the last part a moment later
		m := request(t, nc, "agent.writer.task.output.append", `{"task_id":"big","seq":`+strconv.FormatInt(seq, 10)+`,"data":"eA=="}`)
		msg, header = m.Data, m.Header
		return subjects.AsError(subjects.DecodeReply(msg, &struct{}{})).Code == subjects.CodeQuotaExceeded
	})
	refusedOverNATS(t, "a part over the limit", msg, header, subjects.CodeQuotaExceeded, text)
	if !settledBytes() {
		t.Fatal("the refused part changed the task's count")
	}
	// A whole output sent with a result, too large to stay in the record.
	if _, err := c.StartTask(ctx, "inline", ""); err != nil {
		t.Fatal(err)
	}
	m := request(t, nc, "agent.writer.task.result", `{"task_id":"inline","status":"completed","output":"`+strings.Repeat("y", 20<<10)+`"}`)
	refusedOverNATS(t, "a whole output over the limit", m.Data, m.Header, subjects.CodeQuotaExceeded, "agent writer stores 1048576 bytes of task output; 20480 more")
	if tk, err := c.GetTask(ctx, "inline"); err != nil || tk.Status != tasks.TaskRunning {
		t.Fatalf("the refused result changed the task: %+v %v", tk, err)
	}
	// A small output stays in the record and counts nothing.
	if _, err := c.ReportResult(ctx, tasks.TaskResultRequest{TaskID: "inline", Status: tasks.TaskCompleted, Output: ptr("ok")}); err != nil {
		t.Fatalf("a small output at the limit: %v", err)
	}
	// What was stored before the refusals is whole.
	done, err := c.ReportResult(ctx, tasks.TaskResultRequest{TaskID: "big", Status: tasks.TaskCompleted, OutputAppended: true})
	if err != nil || done.OutputSize != limit {
		t.Fatalf("result: %+v %v", done, err)
	}
	if got, err := c.ReadOutput(ctx, "big"); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back %d bytes (%v), want the %d appended", len(got), err, len(want))
	}
	other, _ := client.New(nc, "other-writer")
	if _, err := other.StartTask(ctx, "x", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := other.AppendOutput(ctx, "x", 0, want[:tasks.MaxAppendChunk]); err != nil {
		t.Fatalf("another agent: %v", err)
	}
	if got := metric(t, r, `chime_quota_refusals_total{quota="task_output"}`); got < 2 {
		t.Errorf("task_output refusals: %v", got)
	}
}

func ptr[T any](v T) *T { return &v }

// TestWaitForLimit: an agent at its live WaitFor registrations is refused
// one in a new scope, over wait.for and wait.tasks; one that replaces a
// scope's registration is admitted; other agents are not touched.
func TestWaitForLimit(t *testing.T) {
	r, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.MaxWaitFors = 2 })
	body := func(item string) string {
		return `{"wake":"external","resource":"deploy","reason":"waiting","delivery":"silent","work_item_id":"` + item + `"}`
	}
	for _, item := range []string{"w1", "w2"} {
		if err := subjects.DecodeReply(request(t, nc, "agent.waiter.wait.for", body(item)).Data, &waitfor.WaitForReply{}); err != nil {
			t.Fatal(err)
		}
	}
	const text = "agent waiter has 2 live WaitFor registrations; at most 2 are allowed (CHIME_MAX_WAITFORS_PER_AGENT)"
	var last []byte
	var header map[string][]string
	testwait.Eventually(t, 5*time.Second, func() bool {
		m := request(t, nc, "agent.waiter.wait.for", body("w3"))
		last, header = m.Data, m.Header
		return subjects.AsError(subjects.DecodeReply(last, &struct{}{})).Code == subjects.CodeQuotaExceeded
	})
	refusedOverNATS(t, "a 3rd scope", last, header, subjects.CodeQuotaExceeded, text)
	m := request(t, nc, "agent.waiter.wait.tasks", `{"task_ids":["a"],"mode":"all","reason":"r","delivery":"silent","work_item_id":"w4"}`)
	refusedOverNATS(t, "wait.tasks in a 4th scope", m.Data, m.Header, subjects.CodeQuotaExceeded, text)
	var reply waitfor.WaitForReply
	if err := subjects.DecodeReply(request(t, nc, "agent.waiter.wait.for", body("w1")).Data, &reply); err != nil || len(reply.CancelledWaitConditionIDs) != 1 {
		t.Fatalf("a replacement in a held scope: %+v %v", reply, err)
	}
	c, _ := client.New(nc, "waiter")
	list := struct {
		WaitFor []waitfor.WaitFor `json:"wait_for"`
	}{}
	if err := c.Request(context.Background(), waits.ActionWaitList, nil, &list); err != nil {
		t.Fatal(err)
	}
	for _, w := range list.WaitFor {
		if w.WorkItemID == "w3" || w.WorkItemID == "w4" {
			t.Fatalf("a refused registration was stored: %+v", w)
		}
	}
	if err := subjects.DecodeReply(request(t, nc, "agent.calm.wait.for", body("w3")).Data, &waitfor.WaitForReply{}); err != nil {
		t.Fatalf("another agent: %v", err)
	}
	if got := metric(t, r, `chime_quota_refusals_total{quota="waitfors"}`); got < 2 {
		t.Errorf("waitfors refusals: %v", got)
	}
}

// TestNotifyRate: past its burst an agent's notifies are refused
// rate_limited with Retry-After; nothing is stored; an operator's create
// over HTTP and other agents go on.
func TestNotifyRate(t *testing.T) {
	r, nc := startChimeWith(t, io.Discard, func(c *config.Config) { c.NotifyRate = 0.01 })
	ctx := context.Background()
	c, _ := client.New(nc, "chatty")
	if err := c.Request(ctx, notifications.ActionNotify, []byte(`{"message":"one"}`), &notifications.NotifyReply{}); err != nil {
		t.Fatal(err)
	}
	m := request(t, nc, "agent.chatty.notify", `{"message":"two"}`)
	refusedOverNATS(t, "2nd notify", m.Data, m.Header, subjects.CodeRateLimited,
		"agent chatty is notifying faster than 0.01 a second (CHIME_NOTIFY_RATE); retry in ")
	base := "http://" + r.HTTPAddr()
	if s, b := post(t, base+"/api/control/agents/chatty/notifications", "application/json", []byte(`{"message":"from an operator"}`)); s != http.StatusOK {
		t.Fatalf("an operator's create: %d %s", s, b)
	}
	var h notifications.ListNotificationsReply
	if err := c.Request(ctx, notifications.ActionNotificationsList, nil, &h); err != nil {
		t.Fatal(err)
	}
	for _, n := range h.Notifications {
		if n.Message == "two" {
			t.Fatal("the refused notify was stored")
		}
	}
	other, _ := client.New(nc, "quiet")
	if err := other.Request(ctx, notifications.ActionNotify, []byte(`{"message":"one"}`), &notifications.NotifyReply{}); err != nil {
		t.Fatalf("another agent: %v", err)
	}
	if got := metric(t, r, `chime_quota_refusals_total{quota="notifies"}`); got != 1 {
		t.Errorf("notifies refusals: %v, want 1", got)
	}
}

// TestStreamsPerPrincipal: a principal at its open event streams is
// refused another (429 quota_exceeded) on either feed; other principals
// (another operator token, an agent) open theirs; a closed stream makes
// room.
func TestStreamsPerPrincipal(t *testing.T) {
	ops := []string{"operator-one-secret", "operator-two-secret"}
	var hashes []string
	for _, op := range ops {
		h := sha256.Sum256([]byte(op))
		hashes = append(hashes, hex.EncodeToString(h[:]))
	}
	file := filepath.Join(t.TempDir(), "operators")
	if err := os.WriteFile(file, []byte(strings.Join(hashes, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, _ := startChimeWith(t, io.Discard, func(c *config.Config) { c.OperatorTokensFile, c.MaxStreams = file, 2 })
	base := "http://" + r.HTTPAddr()
	one := []string{"Authorization", "Bearer " + ops[0]}
	two := []string{"Authorization", "Bearer " + ops[1]}
	status, body := post(t, base+"/api/control/agents/ann/token", "", nil, one...)
	token := struct{ Token string }{}
	if status != http.StatusCreated || jsonUnmarshal(body, &token) != nil {
		t.Fatalf("token: %d %s", status, body)
	}
	agent := []string{"Authorization", "Bearer " + token.Token}

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	first := openStream(t, ctx, base+"/api/notifications/events", one)
	follow(t, base, "/api/agents/ann/inbox/events", one...)
	s, b := getStream(t, base+"/api/notifications/events", one)
	if s != http.StatusTooManyRequests {
		t.Fatalf("a 3rd stream: %d %s", s, b)
	}
	assertError(t, "a 3rd stream", b, subjects.CodeQuotaExceeded, "") // the text names the principal by the start of its hash
	if e := subjects.AsError(subjects.DecodeReply(b, &struct{}{})); !strings.Contains(e.Message, "has 2 event streams open on this replica; at most 2 are allowed (CHIME_MAX_STREAMS_PER_PRINCIPAL)") ||
		strings.Contains(e.Message, ops[0]) {
		t.Errorf("a 3rd stream: %q", e.Message)
	}
	if s, b := getStream(t, base+"/api/agents/ann/inbox/events", one); s != http.StatusTooManyRequests {
		t.Fatalf("a 3rd stream, the inbox feed: %d %s", s, b)
	}
	follow(t, base, "/api/notifications/events", two...)
	follow(t, base, "/api/agents/ann/notifications/events", agent...)
	follow(t, base, "/api/agents/ann/notifications/events", agent...)
	if s, _ := getStream(t, base+"/api/agents/ann/notifications/events", agent); s != http.StatusTooManyRequests {
		t.Fatalf("the agent's 3rd stream: %d", s)
	}
	first() // closed: its place comes back once the server sees it gone
	testwait.Eventually(t, 5*time.Second, func() bool {
		s, _ := getStream(t, base+"/api/notifications/events", one)
		return s == http.StatusOK
	})
	if got := metric(t, r, `chime_quota_refusals_total{quota="streams"}`); got < 3 {
		t.Errorf("streams refusals: %v", got)
	}
}

// TestStreamsLoopback: without operator tokens every caller is one
// principal, loopback.
func TestStreamsLoopback(t *testing.T) {
	r, _ := startChimeWith(t, io.Discard, func(c *config.Config) { c.MaxStreams = 1 })
	base := "http://" + r.HTTPAddr()
	follow(t, base, "/api/notifications/events")
	s, b := getStream(t, base+"/api/agents/x/notifications/events", nil)
	if s != http.StatusTooManyRequests || !strings.Contains(string(b), "loopback has 1 event streams open") {
		t.Fatalf("a 2nd stream: %d %s", s, b)
	}
}

// openStream opens an event stream and returns what closes it.
func openStream(t *testing.T, ctx context.Context, url string, header []string) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	res, err := http.DefaultClient.Do(newRequest(t, ctx, "GET", url, nil, header...))
	if err != nil || res.StatusCode != http.StatusOK {
		cancel()
		t.Fatalf("open %s: %v %v", url, res, err)
	}
	return func() { cancel(); _ = res.Body.Close() }
}

// getStream opens an event stream that is expected to be refused, and
// returns its status and body; one that opens is closed at once.
func getStream(t *testing.T, url string, header []string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := http.DefaultClient.Do(newRequest(t, ctx, "GET", url, nil, header...))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode == http.StatusOK {
		return res.StatusCode, nil
	}
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

func jsonUnmarshal(b []byte, v any) error {
	if err := subjects.DecodeReply(b, v); err != nil {
		return fmt.Errorf("%s: %w", b, err)
	}
	return nil
}
