package mcp_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/config"
	"github.com/chime-nats/chime/mcp"
	"github.com/chime-nats/chime/replica"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

// operator is the operator token the replicas accept.
const operator = "operator-mcp-token"

// chime is a replica under test, restartable on its data.
type chime struct {
	t   *testing.T
	cfg *config.Config
	r   *replica.Replica
}

func startChime(t *testing.T) *chime {
	t.Helper()
	return startChimeWith(t, nil)
}

// startChimeWith starts a replica whose configuration adjust changes.
func startChimeWith(t *testing.T, adjust func(*config.Config)) *chime {
	t.Helper()
	h := sha256.Sum256([]byte(operator))
	file := filepath.Join(t.TempDir(), "operators")
	if err := os.WriteFile(file, []byte(hex.EncodeToString(h[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &chime{t: t, cfg: &config.Config{
		DataDir: t.TempDir(), NATSListen: "127.0.0.1:-1", JSReplicas: 1, HTTPAddr: "127.0.0.1:0",
		ReplicaID: "mcp", Shards: 8, LeaseTTL: 2 * time.Second, InboxMaxAge: time.Hour, EventMaxAge: time.Hour,
		LogLevel: "info", LogFormat: "text", OperatorTokensFile: file, RecordRetention: time.Hour,
	}}
	if adjust != nil {
		adjust(c.cfg)
	}
	c.start()
	t.Cleanup(func() { c.r.Stop(context.Background()) })
	return c
}

func (c *chime) start() {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := replica.Start(ctx, c.cfg, slog.New(slog.DiscardHandler), "0.0.0-test")
	if err != nil {
		c.t.Fatal(err)
	}
	c.r = r
}

// restart stops the replica and starts another on the same data.
func (c *chime) restart() {
	c.t.Helper()
	c.r.Stop(context.Background())
	c.start()
}

func (c *chime) url(agentID string) string {
	return "http://" + c.r.HTTPAddr() + "/api/agents/" + agentID + "/mcp"
}

func (c *chime) nats(t *testing.T) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(c.r.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// recorder is an HTTP client that sends a bearer token and keeps every
// reply body: the go-sdk client does not show a tools/call answered with
// a task, so the test reads the task from the wire.
type recorder struct {
	token string
	mu    sync.Mutex
	seen  [][]byte
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+r.token)
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.seen = append(r.seen, body)
	r.mu.Unlock()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

// lastTask is the task of the last reply that carried one.
func (r *recorder) lastTask(t *testing.T) task {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.seen) - 1; i >= 0; i-- {
		var msg struct {
			Result task `json:"result"`
		}
		if json.Unmarshal(r.seen[i], &msg) == nil && msg.Result.ResultType == "task" {
			return msg.Result
		}
	}
	t.Fatal("no reply carried a task")
	return task{}
}

// task is the extension's Task as the test reads it.
type task struct {
	sdk.ResultBase
	ResultType     string                     `json:"resultType"`
	TaskID         string                     `json:"taskId"`
	Status         string                     `json:"status"`
	StatusMessage  string                     `json:"statusMessage"`
	CreatedAt      string                     `json:"createdAt"`
	LastUpdatedAt  string                     `json:"lastUpdatedAt"`
	TTLMs          *int64                     `json:"ttlMs"`
	PollIntervalMs int64                      `json:"pollIntervalMs"`
	InputRequests  map[string]json.RawMessage `json:"inputRequests"`
	Result         *sdk.CallToolResult        `json:"result"`
}

type taskParams struct {
	sdk.ParamsBase
	TaskID string `json:"taskId"`
}

type updateParams struct {
	sdk.ParamsBase
	TaskID         string         `json:"taskId"`
	InputResponses map[string]any `json:"inputResponses"`
}

type ack struct {
	sdk.ResultBase
	ResultType string `json:"resultType"`
}

// connect opens a go-sdk client session on agentID's server with token;
// withTasks declares the Tasks extension.
func connect(t *testing.T, c *chime, agentID, token string, withTasks bool) (*sdk.ClientSession, *recorder) {
	t.Helper()
	caps := &sdk.ClientCapabilities{}
	if withTasks {
		caps.AddExtension(mcp.TasksExtension, nil)
	}
	cl := sdk.NewClient(&sdk.Implementation{Name: "chime-test", Version: "1"}, &sdk.ClientOptions{Capabilities: caps})
	if err := sdk.AddSendingCustomMethod[*taskParams, *task](cl, "tasks/get"); err != nil {
		t.Fatal(err)
	}
	if err := sdk.AddSendingCustomMethod[*taskParams, *ack](cl, "tasks/cancel"); err != nil {
		t.Fatal(err)
	}
	if err := sdk.AddSendingCustomMethod[*updateParams, *ack](cl, "tasks/update"); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{token: token}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := cl.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: c.url(agentID), HTTPClient: &http.Client{Transport: rec}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs, rec
}

func call(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) *sdk.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

func text(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func getTask(t *testing.T, cs *sdk.ClientSession, taskID string) (*task, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return sdk.CallCustomMethod[*taskParams, *task](ctx, cs, "tasks/get", &taskParams{TaskID: taskID})
}

// pollTask polls tasks/get at the task's interval until its status is one
// of want.
func pollTask(t *testing.T, cs *sdk.ClientSession, taskID string, want ...string) *task {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := getTask(t, cs, taskID)
		if err != nil {
			t.Fatalf("tasks/get %s: %v", taskID, err)
		}
		if slices.Contains(want, got.Status) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s still %s (%s), want %v", taskID, got.Status, got.StatusMessage, want)
		}
		time.Sleep(time.Duration(max(got.PollIntervalMs, 50)) * time.Millisecond)
	}
}

func issueToken(t *testing.T, nc *nats.Conn, agentID string) string {
	t.Helper()
	c, err := client.New(nc, agentID)
	if err != nil {
		t.Fatal(err)
	}
	issued, err := c.IssueToken(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return issued.Token
}
