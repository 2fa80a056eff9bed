package browser_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// mcpClient speaks MCP 2026-07-28 to an agent's server as a client that
// declares the Tasks extension does, in plain JSON-RPC over HTTP.
type mcpClient struct {
	t   *testing.T
	url string
	id  int
}

func (c *mcpClient) call(method, name string, params map[string]any) map[string]any {
	c.t.Helper()
	c.id++
	params["_meta"] = map[string]any{
		"io.modelcontextprotocol/protocolVersion": "2026-07-28",
		"io.modelcontextprotocol/clientInfo":      map[string]any{"name": "browser-test", "version": "1"},
		"io.modelcontextprotocol/clientCapabilities": map[string]any{
			"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}},
		},
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.id, "method": method, "params": params})
	req, _ := http.NewRequest(http.MethodPost, c.url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	if name != "" {
		req.Header.Set("Mcp-Name", name)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	var msg struct {
		Result map[string]any `json:"result"`
		Error  map[string]any `json:"error"`
	}
	if err := json.NewDecoder(res.Body).Decode(&msg); err != nil || msg.Error != nil {
		c.t.Fatalf("%s %s: %d %v %v", method, name, res.StatusCode, msg.Error, err)
	}
	return msg.Result
}

// until polls tasks/get until the task's status is want.
func (c *mcpClient) until(taskID, want string) map[string]any {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		task := c.call("tasks/get", taskID, map[string]any{"taskId": taskID})
		if task["status"] == want {
			return task
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("task %s: %v, want %s", taskID, task["status"], want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func resultText(task map[string]any) string {
	res, _ := task["result"].(map[string]any)
	content, _ := res["content"].([]any)
	var b strings.Builder
	for _, c := range content {
		if m, ok := c.(map[string]any); ok {
			s, _ := m["text"].(string)
			b.WriteString(s)
		}
	}
	return b.String()
}

// TestConsoleAndMCPTasks: an MCP client's question, answered by the
// operator on the page, completes its task with the answer; its wait, ended
// by an intervention from the page, completes with the operator's words.
func TestConsoleAndMCPTasks(t *testing.T) {
	p, _, _ := consoleChime(t, "mia")
	base := "http://" + p.httpAddr
	mcp := &mcpClient{t: t, url: base + "/api/agents/mia/mcp"}

	asked := mcp.call("tools/call", "question_ask", map[string]any{"name": "question_ask", "arguments": map[string]any{
		"questions": []any{map[string]any{"title": "Roll out to eu-west?", "options": []string{"roll out", "hold"}}}}})
	if asked["resultType"] != "task" {
		t.Fatalf("question_ask: %v", asked)
	}
	questionTask, _ := asked["taskId"].(string)
	if open := mcp.until(questionTask, "input_required"); open["inputRequests"] == nil {
		t.Fatalf("an open question's task: %v", open)
	}
	waited := mcp.call("tools/call", "wait", map[string]any{"name": "wait", "arguments": map[string]any{"minutes": 10}})
	waitTask, _ := waited["taskId"].(string)

	ctx := browser(t)
	form := `#q-list form.question`
	run(t, ctx, 30*time.Second, "answer the MCP client's question",
		chromedp.Navigate(base+"/?agent=mia"),
		chromedp.WaitVisible(chromedp.CSS(form)),
		chromedp.Click(chromedp.CSS(form+` .options button:nth-child(2)`)),
		chromedp.Click(chromedp.CSS(form+` button[type="submit"]`)),
		chromedp.WaitNotPresent(chromedp.CSS(form)))
	if text := resultText(mcp.until(questionTask, "completed")); !strings.Contains(text, "Answer: hold") {
		t.Errorf("the answered task: %q", text)
	}

	run(t, ctx, 30*time.Second, "intervene",
		chromedp.SetValue(chromedp.ID("i-text"), "the rollout is paused, stop waiting"),
		chromedp.Click(chromedp.CSS(`#i-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#d-list li[data-kind="wait_cancelled"]`)))
	if text := resultText(mcp.until(waitTask, "completed")); text != "the rollout is paused, stop waiting" {
		t.Errorf("the intervened wait's task: %q", text)
	}
}
