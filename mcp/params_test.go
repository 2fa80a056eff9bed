package mcp_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestRequestsWithoutParams: a request of the task methods, or a tool call,
// with its params left out or null (the TypeScript SDK leaves them out
// when a request is given none) is a JSON-RPC error, not a panic that
// takes the replica down; the server answers the next request.
func TestRequestsWithoutParams(t *testing.T) {
	c := startChime(t)
	token := issueToken(t, c.nats(t), "ip")
	post := func(body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, c.url("ip"), strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, method := range []string{"tasks/get", "tasks/update", "tasks/cancel", "tools/call"} {
		for _, params := range []string{``, `,"params":null`} {
			body := `{"jsonrpc":"2.0","id":1,"method":"` + method + `"` + params + `}`
			status, got := post(body)
			var msg struct {
				Error *struct {
					Code int `json:"code"`
				} `json:"error"`
			}
			switch {
			case method == "tools/call":
				// The SDK refuses it before chime sees it: a 400 without
				// params, invalid request (-32600) with null ones.
				if status != http.StatusBadRequest && (json.Unmarshal([]byte(got), &msg) != nil || msg.Error == nil) {
					t.Errorf("%s: %d %s, want a refusal", body, status, got)
				}
			case status != http.StatusOK || json.Unmarshal([]byte(got), &msg) != nil || msg.Error == nil || msg.Error.Code != -32602:
				t.Errorf("%s: %d %s, want invalid params (-32602)", body, status, got)
			}
			if status, got := post(`{"jsonrpc":"2.0","id":2,"method":"ping"}`); status != http.StatusOK || !strings.Contains(got, `"result":{}`) {
				t.Fatalf("a ping after %s: %d %s", body, status, got)
			}
		}
	}
}
