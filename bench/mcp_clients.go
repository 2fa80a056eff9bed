package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/chime-nats/chime/client"
	"github.com/chime-nats/chime/mcp"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/waits"
)

// mcpFleet is the bench's agents on one replica: MCP clients over HTTP
// and NATS connections, each agent its own.
type mcpFleet struct {
	url, http string // the replica's NATS URL and HTTP base
	auth      []nats.Option
	tokens    bool
	run       string

	mu     sync.Mutex
	op     *nats.Conn
	closes []func()
}

func (f *mcpFleet) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.closes) - 1; i >= 0; i-- {
		f.closes[i]()
	}
	f.closes = nil
	if f.op != nil {
		f.op.Close()
		f.op = nil
	}
}

func (f *mcpFleet) onClose(fn func()) {
	f.mu.Lock()
	f.closes = append(f.closes, fn)
	f.mu.Unlock()
}

// token issues a token for agentID when tokens are on (else none).
func (f *mcpFleet) token(ctx context.Context, agentID string) (string, error) {
	if !f.tokens {
		return "", nil
	}
	f.mu.Lock()
	if f.op == nil {
		op, err := nats.Connect(f.url, append(f.auth, nats.Name("chime-bench operator"))...)
		if err != nil {
			f.mu.Unlock()
			return "", fmt.Errorf("bench: connect: %w", err)
		}
		f.op = op
	}
	op := f.op
	f.mu.Unlock()
	return issueToken(ctx, op, agentID)
}

func (f *mcpFleet) agentID(kind string, i int) string { return fmt.Sprintf("%s-%s%d", f.run, kind, i) }

// mcpAgent is an agent's MCP client: a go-sdk session over its own HTTP
// client. withTasks declares the Tasks extension on every request.
type mcpAgent struct {
	id string
	cs *sdk.ClientSession
	rt *mcpTransport
}

func (f *mcpFleet) mcpAgents(ctx context.Context, kind string, n int, withTasks bool) ([]*mcpAgent, error) {
	agents := make([]*mcpAgent, n)
	for i := range agents {
		a, err := f.mcpAgent(ctx, f.agentID(kind, i), withTasks)
		if err != nil {
			return nil, err
		}
		agents[i] = a
	}
	return agents, nil
}

func (f *mcpFleet) mcpAgent(ctx context.Context, agentID string, withTasks bool) (*mcpAgent, error) {
	tok, err := f.token(ctx, agentID)
	if err != nil {
		return nil, err
	}
	caps := &sdk.ClientCapabilities{}
	if withTasks {
		caps.AddExtension(mcp.TasksExtension, nil)
	}
	cl := sdk.NewClient(&sdk.Implementation{Name: "chime-bench", Version: "1"}, &sdk.ClientOptions{Capabilities: caps})
	if err := errors.Join(
		sdk.AddSendingCustomMethod[*mcpTaskParams, *mcpTask](cl, "tasks/get"),
		sdk.AddSendingCustomMethod[*mcpTaskParams, *mcpAck](cl, "tasks/cancel"),
	); err != nil {
		return nil, err
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second}
	rt := &mcpTransport{base: tr, token: tok}
	f.onClose(tr.CloseIdleConnections)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cs, err := cl.Connect(cctx, &sdk.StreamableClientTransport{
		Endpoint: f.http + "/api/agents/" + agentID + "/mcp", HTTPClient: &http.Client{Transport: rt}, DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("bench: MCP connect as %s: %w", agentID, err)
	}
	f.onClose(func() { _ = cs.Close() })
	return &mcpAgent{id: agentID, cs: cs, rt: rt}, nil
}

// mcpTransport is an agent's HTTP transport: it sends the agent's bearer
// token and keeps the last reply body (the go-sdk client does not show a
// tools/call answered with a task) and its round trip's time.
type mcpTransport struct {
	base  http.RoundTripper
	token string

	mu   sync.Mutex
	last []byte
	wire time.Duration
}

func (t *mcpTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.token != "" {
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", "Bearer "+t.token)
	}
	t0 := time.Now()
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	wire := time.Since(t0)
	t.mu.Lock()
	t.last, t.wire = body, wire
	t.mu.Unlock()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, nil
}

func (t *mcpTransport) lastBody() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.last
}

func (t *mcpTransport) lastWire() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.wire
}

// mcpTask is the extension's Task (and DetailedTask) as the bench reads it.
type mcpTask struct {
	sdk.ResultBase
	ResultType     string              `json:"resultType"`
	TaskID         string              `json:"taskId"`
	Status         string              `json:"status"`
	StatusMessage  string              `json:"statusMessage"`
	LastUpdatedAt  string              `json:"lastUpdatedAt"`
	PollIntervalMs int64               `json:"pollIntervalMs"`
	Result         *sdk.CallToolResult `json:"result"`
}

type mcpTaskParams struct {
	sdk.ParamsBase
	TaskID string `json:"taskId"`
}

type mcpAck struct {
	sdk.ResultBase
	ResultType string `json:"resultType"`
}

// callTask calls the wait tool and returns the task it answered with.
func (a *mcpAgent) callTask(ctx context.Context, args map[string]any) (*mcpTask, error) {
	res, err := a.cs.CallTool(ctx, &sdk.CallToolParams{Name: "wait", Arguments: args})
	if err != nil {
		return nil, fmt.Errorf("tools/call wait: %w", err)
	}
	if res.IsError {
		return nil, fmt.Errorf("tools/call wait: %s", toolText(res))
	}
	var msg struct {
		Result mcpTask `json:"result"`
	}
	if err := json.Unmarshal(a.rt.lastBody(), &msg); err != nil || msg.Result.ResultType != "task" || msg.Result.TaskID == "" {
		return nil, fmt.Errorf("tools/call wait: not answered with a task: %.200s", a.rt.lastBody())
	}
	return &msg.Result, nil
}

func (a *mcpAgent) get(ctx context.Context, taskID string) (*mcpTask, error) {
	t, err := sdk.CallCustomMethod[*mcpTaskParams, *mcpTask](ctx, a.cs, "tasks/get", &mcpTaskParams{TaskID: taskID})
	if err != nil {
		return nil, fmt.Errorf("tasks/get %s: %w", taskID, err)
	}
	return t, nil
}

func (a *mcpAgent) cancel(ctx context.Context, taskID string) error {
	if _, err := sdk.CallCustomMethod[*mcpTaskParams, *mcpAck](ctx, a.cs, "tasks/cancel", &mcpTaskParams{TaskID: taskID}); err != nil {
		return fmt.Errorf("tasks/cancel %s: %w", taskID, err)
	}
	return nil
}

func toolText(res *sdk.CallToolResult) string {
	var b bytes.Buffer
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// targetOf reads a wait's target from its end's structured content (the
// inbox envelope's data).
func targetOf(res *sdk.CallToolResult) (time.Time, error) {
	if res == nil {
		return time.Time{}, errors.New("no result")
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return time.Time{}, err
	}
	var data waits.WaitEndData
	if err := json.Unmarshal(b, &data); err != nil || data.TargetTime == "" {
		return time.Time{}, fmt.Errorf("no target_time in %.200s", b)
	}
	return time.Parse(time.RFC3339Nano, data.TargetTime)
}

// natsAgent is an agent on a NATS connection of its own, presenting its
// token when tokens are on.
type natsAgent struct {
	id string
	nc *nats.Conn
	c  *client.Client
}

func (f *mcpFleet) natsAgents(ctx context.Context, kind string, n int) ([]*natsAgent, error) {
	agents := make([]*natsAgent, n)
	for i := range agents {
		id := f.agentID(kind, i)
		tok, err := f.token(ctx, id)
		if err != nil {
			return nil, err
		}
		nc, err := nats.Connect(f.url, append(client.ConnectOptions(id, tok), nats.Name("chime-bench agent"))...)
		if err != nil {
			return nil, fmt.Errorf("bench: connect as agent %s: %w", id, err)
		}
		f.onClose(nc.Close)
		c, err := client.New(nc, id)
		if err != nil {
			return nil, err
		}
		agents[i] = &natsAgent{id: id, nc: nc, c: c}
	}
	return agents, nil
}

// request asks for a wait of seconds and returns its reply.
func (a *natsAgent) request(ctx context.Context, seconds int) (*waits.WaitReply, error) {
	var reply waits.WaitReply
	body := fmt.Appendf(nil, `{"seconds":%d}`, seconds)
	if err := a.c.Request(ctx, waits.ActionWaitRequest, body, &reply); err != nil {
		return nil, err
	}
	return &reply, nil
}

func (a *natsAgent) cancelWait(ctx context.Context, waitID string) error {
	_, err := a.c.CancelWait(ctx, waitID)
	return err
}

// waitCompleteOf reads an envelope's wait ID and target when it is a
// wait_complete.
func waitCompleteOf(raw []byte) (string, time.Time, bool) {
	var env subjects.Envelope
	if json.Unmarshal(raw, &env) != nil || env.Kind != subjects.KindWaitComplete {
		return "", time.Time{}, false
	}
	var data waits.WaitEndData
	if json.Unmarshal(env.Data, &data) != nil {
		return "", time.Time{}, false
	}
	due, err := time.Parse(time.RFC3339Nano, data.TargetTime)
	if err != nil {
		return "", time.Time{}, false
	}
	return data.WaitID, due, true
}
