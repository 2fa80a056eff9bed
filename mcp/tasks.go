package mcp

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/internal/kvrec"
	"github.com/chime-nats/chime/subjects"
)

// The Tasks extension (SEP-2663), served over chime's records: a task is a
// handle (which action, which record) stored before the task is returned;
// its status is read from the record at each tasks/get, so it is the same
// on every replica and after any restart, and nothing but the handle is
// kept for it.

// handle is a stored task: key <agent>.<task> in chime_mcp_tasks.
type handle struct {
	TaskID    string    `json:"task_id"`
	AgentID   string    `json:"agent_id"`
	Action    string    `json:"action"`
	Ref       string    `json:"ref"` // the record the task follows
	CreatedAt time.Time `json:"created_at"`
	// CancelledAt is set by tasks/cancel (and by a declined question):
	// the task is cancelled unless its record ended before.
	CancelledAt *time.Time `json:"cancelled_at,omitempty"`
	// EndReadAt is when a tasks/get first answered the task ended: it
	// is kept readTTL more under its read key, then goes.
	EndReadAt *time.Time `json:"end_read_at,omitempty"`
	key       string     // live or read
	rev       uint64
	written   time.Time
}

// readTTL is how long an ended task stays once a tasks/get has answered
// it: long enough for a client to read it again after a lost reply.
const readTTL = time.Hour

// handles stores task handles.
type handles struct {
	kv      jetstream.KeyValue
	js      jetstream.JetStream
	ttl     time.Duration
	markers time.Duration // how long a removal's marker stays
	now     func() time.Time
}

// newTaskID is 130 random bits: task IDs are bearer names of a task
// (the extension's security rule), scoped to the agent besides.
func newTaskID() string {
	var b [17]byte
	_, _ = rand.Read(b[:])
	return "mcpt_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// A handle lives under live.<agent>.<task> while its task goes or has
// ended unread (the agent's bound counts these), and under
// read.<agent>.<task> once a tasks/get has answered its end.
const (
	livePrefix = "live."
	readPrefix = "read."
)

func liveKey(agentID, taskID string) string { return livePrefix + agentID + "." + taskID }
func readKey(agentID, taskID string) string { return readPrefix + agentID + "." + taskID }

// create stores a new handle; the task may be returned once this returns
// (a tasks/get on any replica then finds it: see get).
func (h *handles) create(ctx context.Context, agentID, act, ref string) (*handle, error) {
	t := &handle{TaskID: newTaskID(), AgentID: agentID, Action: act, Ref: ref, CreatedAt: h.now().UTC()}
	t.key = liveKey(agentID, t.TaskID)
	b, err := json.Marshal(t)
	if err != nil {
		return nil, err
	}
	var opts []jetstream.KVCreateOpt
	if h.ttl > 0 {
		opts = append(opts, jetstream.KeyTTL(h.ttl))
	}
	if t.rev, err = h.kv.Create(ctx, t.key, b, opts...); err != nil {
		return nil, fmt.Errorf("mcp: store task: %w", err)
	}
	t.written = t.CreatedAt
	return t, nil
}

// errNoTask is a task the agent does not have (never, or expired).
var errNoTask = errors.New("mcp: no such task")

// get reads the agent's handle of taskID, live or read.
func (h *handles) get(ctx context.Context, agentID, taskID string) (*handle, error) {
	if subjects.ValidateID("taskId", taskID) != nil {
		return nil, errNoTask
	}
	t, err := h.getKey(ctx, liveKey(agentID, taskID))
	if errors.Is(err, errNoTask) {
		t, err = h.getKey(ctx, readKey(agentID, taskID))
	}
	return t, err
}

// getKey reads one handle. A key not found is read again from the
// stream's leader: the KV read may be served by a replica a moment behind
// the create that stored it.
func (h *handles) getKey(ctx context.Context, key string) (*handle, error) {
	var data []byte
	var rev uint64
	var at time.Time
	e, err := h.kv.Get(ctx, key)
	switch {
	case err == nil:
		data, rev, at = e.Value(), e.Revision(), e.Created()
	case errors.Is(err, jetstream.ErrKeyNotFound):
		m, lerr := h.leaderRead(ctx, key)
		if lerr != nil {
			return nil, lerr
		}
		data, rev, at = m.Data, m.Sequence, m.Time
	default:
		return nil, fmt.Errorf("mcp: read task: %w", err)
	}
	var t handle
	if err := json.Unmarshal(data, &t); err != nil {
		return nil, fmt.Errorf("mcp: task %s: %w", key, err)
	}
	t.key, t.rev, t.written = key, rev, at
	return &t, nil
}

// leaderRead reads key's last message from the bucket's stream leader.
func (h *handles) leaderRead(ctx context.Context, key string) (*jetstream.RawStreamMsg, error) {
	st, err := h.js.Stream(ctx, "KV_"+h.kv.Bucket())
	if err != nil {
		return nil, fmt.Errorf("mcp: read task: %w", err)
	}
	m, err := st.GetLastMsgForSubject(ctx, "$KV."+h.kv.Bucket()+"."+key)
	if errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && m.Header.Get("KV-Operation") != "") {
		return nil, errNoTask
	}
	if err != nil {
		return nil, fmt.Errorf("mcp: read task: %w", err)
	}
	return m, nil
}

// ttlOf is the life a write gives t: the retention while live, readTTL
// once read.
func (h *handles) ttlOf(t *handle) time.Duration {
	if strings.HasPrefix(t.key, readPrefix) {
		return readTTL
	}
	return h.ttl
}

// write stores t's change by CAS: a write also renews the task's life.
func (h *handles) write(ctx context.Context, t *handle) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if ttl := h.ttlOf(t); ttl > 0 {
		t.rev, err = kvrec.UpdateTTL(ctx, h.js, h.kv.Bucket(), t.key, b, t.rev, ttl)
	} else {
		t.rev, err = h.kv.Update(ctx, t.key, b, t.rev)
	}
	if err != nil {
		return fmt.Errorf("mcp: write task: %w", err)
	}
	t.written = h.now()
	return nil
}

// renew rewrites a live task's handle once half its life has passed, so
// that a task lives as long as it is followed.
func (h *handles) renew(ctx context.Context, t *handle) error {
	if h.ttl <= 0 || strings.HasPrefix(t.key, readPrefix) || h.now().Sub(t.written) < h.ttl/2 {
		return nil
	}
	err := h.write(ctx, t)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return nil // another poll renewed it
	}
	return err
}

// read moves an ended task whose end a tasks/get answered to its read
// key, where it stays readTTL (for a client that lost the reply) and no
// longer counts against the agent. A crash between the two writes leaves
// it under both, counted until its live key expires.
func (h *handles) read(ctx context.Context, t *handle) error {
	if strings.HasPrefix(t.key, readPrefix) {
		return nil
	}
	r := *t
	r.EndReadAt = new(h.now().UTC())
	r.key = readKey(t.AgentID, t.TaskID)
	b, err := json.Marshal(&r)
	if err != nil {
		return err
	}
	if _, err := h.kv.Create(ctx, r.key, b, jetstream.KeyTTL(readTTL)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("mcp: move a read task: %w", err)
	}
	if err := h.kv.Purge(ctx, t.key, jetstream.LastRevision(t.rev), jetstream.PurgeTTL(h.markers)); err != nil &&
		!errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("mcp: move a read task: %w", err)
	}
	*t = r
	return nil
}

// held counts the agent's live tasks: the keys under its live prefix,
// read from the stream's subjects (a removal's marker counts until it
// expires, a minute).
func (h *handles) held(ctx context.Context, agentID string) (int, error) {
	st, err := h.js.Stream(ctx, "KV_"+h.kv.Bucket())
	if err != nil {
		return 0, fmt.Errorf("mcp: count tasks: %w", err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("$KV."+h.kv.Bucket()+"."+livePrefix+agentID+".>"))
	if err != nil {
		return 0, fmt.Errorf("mcp: count tasks: %w", err)
	}
	return len(info.State.Subjects), nil
}

// task is the Task of the extension, with its status's fields inlined.
type task struct {
	sdk.ResultBase
	ResultType     string         `json:"resultType"`
	TaskID         string         `json:"taskId"`
	Status         action.State   `json:"status"`
	StatusMessage  string         `json:"statusMessage,omitempty"`
	CreatedAt      string         `json:"createdAt"`
	LastUpdatedAt  string         `json:"lastUpdatedAt"`
	TTLMs          *int64         `json:"ttlMs"`
	PollIntervalMs int64          `json:"pollIntervalMs,omitempty"`
	InputRequests  map[string]any `json:"inputRequests,omitempty"`
	Result         any            `json:"result,omitempty"`
	Error          any            `json:"error,omitempty"`
}

// answersKey names a question's one input request; a task follows one
// question, so the key is never reused for another request.
const answersKey = "answers"

// view reads where t stands and shapes it as the extension's task.
func (s *Server) view(ctx context.Context, t *handle, resultType string) (*task, error) {
	later, err := s.laterOf(t)
	if err != nil {
		return nil, err
	}
	out, err := later.Outcome(ctx, t.AgentID, t.Ref)
	if notFound(err) {
		return nil, errNoTask // the record expired, and the task with it
	}
	if err != nil {
		return nil, err
	}
	v := &task{ResultType: resultType, TaskID: t.TaskID, Status: out.State, StatusMessage: out.Message,
		CreatedAt: subjects.FormatISO(t.CreatedAt), PollIntervalMs: pollInterval(t.CreatedAt, out.Due, s.cfg.Now())}
	updated := out.Updated
	if updated.Before(t.CreatedAt) {
		updated = t.CreatedAt
	}
	switch {
	case t.EndReadAt != nil:
		v.TTLMs = new(t.EndReadAt.Add(readTTL).Sub(t.CreatedAt).Milliseconds())
	case s.handles.ttl > 0:
		v.TTLMs = new(s.handles.ttl.Milliseconds())
	}
	ended := out.State == action.Done || out.State == action.Cancelled
	if t.CancelledAt != nil && (!ended || out.Updated.After(*t.CancelledAt)) {
		v.Status, v.StatusMessage, updated = action.Cancelled, "cancelled by the client", *t.CancelledAt
		ended = true
	}
	v.LastUpdatedAt = subjects.FormatISO(updated)
	switch {
	case v.Status == action.Done:
		v.Result = outcomeResult(out)
		v.PollIntervalMs = 0
	case ended:
		if v.StatusMessage == "" {
			v.StatusMessage = out.Text
		}
		v.PollIntervalMs = 0
	case v.Status == action.NeedsInput:
		v.InputRequests = map[string]any{answersKey: elicitation(out)}
	}
	switch {
	case !ended:
		if err := s.handles.renew(ctx, t); err != nil {
			s.log.Warn("renewing a task", "agent_id", t.AgentID, "task_id", t.TaskID, "err", err)
		}
	case resultType == "complete":
		if err := s.handles.read(ctx, t); err != nil {
			s.log.Warn("marking a task read", "agent_id", t.AgentID, "task_id", t.TaskID, "err", err)
		}
	}
	return v, nil
}

// laterOf is the Later that follows t's record; a handle whose action no
// longer follows one (a handle of another version) is no task.
func (s *Server) laterOf(t *handle) (action.Later, error) {
	a, ok := s.cfg.Table.Lookup(t.Action)
	if !ok || a.Tool == nil || a.Tool.Later == nil {
		return nil, errNoTask
	}
	return a.Tool.Later, nil
}

// pollInterval is small while a task is young (most waits and answers
// come soon) and backs off as it ages; a task whose record knows when it
// is due is asked to look just after that, if sooner.
func pollInterval(created, due, now time.Time) int64 {
	var every time.Duration
	switch age := now.Sub(created); {
	case age < 10*time.Second:
		every = 500 * time.Millisecond
	case age < time.Minute:
		every = 2 * time.Second
	case age < 10*time.Minute:
		every = 5 * time.Second
	default:
		every = 15 * time.Second
	}
	return max(nextLook(every, due, now), 100*time.Millisecond).Milliseconds()
}

// elicitation is a question's form: one string field per question, a
// choice among its options when it has them.
func elicitation(out action.Outcome) map[string]any {
	props := map[string]any{}
	var required, titles []string
	for i, q := range out.Questions {
		name := fmt.Sprintf("answer_%d", i+1)
		p := map[string]any{"type": "string", "title": q.Title}
		if len(q.Options) > 0 {
			p["enum"] = q.Options
		}
		props[name] = p
		required = append(required, name)
		titles = append(titles, q.Title)
	}
	return map[string]any{"method": "elicitation/create", "params": map[string]any{
		"mode": "form", "message": strings.Join(titles, "\n"),
		"requestedSchema": map[string]any{"type": "object", "properties": props, "required": required},
	}}
}

// taskCalls answers a later tool's call with a task when the client
// declared the Tasks extension on the request and the outcome is still to
// come; every other call goes on to its tool.
func (s *Server) taskCalls(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		if method != "tools/call" {
			return next(ctx, method, req)
		}
		p, ok := req.GetParams().(*sdk.CallToolParamsRaw)
		if !ok || p == nil || !declaresTasks(p.Meta) {
			return next(ctx, method, req)
		}
		a := s.tools[p.Name]
		if a == nil || a.Tool.Later == nil {
			return next(ctx, method, req)
		}
		agentID := agentOf(ctx)
		// The bound is checked before the action runs, so that a refused
		// call has made nothing.
		if err := s.admit(ctx, agentID); err != nil {
			return errorResult(err), nil
		}
		reply, res := s.run(ctx, a, agentID, p.Arguments)
		if reply == nil {
			return res, nil
		}
		ref, later := a.Tool.Later.Pending(reply)
		if !later {
			return res, nil
		}
		t, err := s.handles.create(ctx, agentID, a.Name, ref)
		if err != nil {
			s.log.Warn("storing a task", "agent_id", agentID, "action", a.Name, "ref", ref, "err", err)
			return errorResult(err), nil
		}
		v, err := s.view(ctx, t, "task")
		if err != nil {
			return nil, rpcError(err)
		}
		// CreateTaskResult is a Task, not a DetailedTask: what it asks or
		// returns is read with tasks/get (a client would take inputRequests
		// here for a multi round-trip request of the call).
		v.InputRequests, v.Result = nil, nil
		return v, nil
	}
}

// admit refuses a task beyond the agent's bound; concurrent calls may
// overshoot it by what is in flight.
func (s *Server) admit(ctx context.Context, agentID string) error {
	if s.cfg.Quotas == nil {
		return nil
	}
	held, err := s.handles.held(ctx, agentID)
	if err != nil {
		return err
	}
	return s.cfg.Quotas.MCPTask(agentID, held)
}

// declaresTasks reports a request whose per-request client capabilities
// declare the Tasks extension.
func declaresTasks(meta map[string]any) bool {
	caps, _ := meta[sdk.MetaKeyClientCapabilities].(map[string]any)
	ext, _ := caps["extensions"].(map[string]any)
	_, ok := ext[TasksExtension]
	return ok
}

type taskParams struct {
	sdk.ParamsBase
	TaskID string `json:"taskId"`
}

type updateParams struct {
	sdk.ParamsBase
	TaskID         string                     `json:"taskId"`
	InputResponses map[string]json.RawMessage `json:"inputResponses"`
}

type ack struct {
	sdk.ResultBase
	ResultType string `json:"resultType"`
}

// addTaskMethods serves tasks/get, tasks/update and tasks/cancel. The SDK
// hands a custom method's handler nil params when the request has none
// (or null): each method reads them as empty, so that the missing taskId
// is the unknown task's -32602.
func (s *Server) addTaskMethods(srv *sdk.Server) error {
	get := func(ctx context.Context, _ *sdk.ServerSession, p *taskParams) (*task, error) {
		if p == nil {
			p = &taskParams{}
		}
		t, err := s.handles.get(ctx, agentOf(ctx), p.TaskID)
		if err != nil {
			return nil, rpcError(err)
		}
		v, err := s.view(ctx, t, "complete")
		if err != nil {
			return nil, rpcError(err)
		}
		return v, nil
	}
	update := func(ctx context.Context, _ *sdk.ServerSession, p *updateParams) (*ack, error) {
		if p == nil {
			p = &updateParams{}
		}
		if err := s.update(ctx, agentOf(ctx), p); err != nil {
			return nil, rpcError(err)
		}
		return &ack{ResultType: "complete"}, nil
	}
	cancel := func(ctx context.Context, _ *sdk.ServerSession, p *taskParams) (*ack, error) {
		if p == nil {
			p = &taskParams{}
		}
		if err := s.cancel(ctx, agentOf(ctx), p.TaskID); err != nil {
			return nil, rpcError(err)
		}
		return &ack{ResultType: "complete"}, nil
	}
	return errors.Join(
		sdk.AddReceivingCustomMethod(srv, "tasks/get", get),
		sdk.AddReceivingCustomMethod(srv, "tasks/update", update),
		sdk.AddReceivingCustomMethod(srv, "tasks/cancel", cancel),
	)
}

// inputResponse is one answer to an input request: an elicitation's.
type inputResponse struct {
	Action  string         `json:"action"` // accept, decline, cancel
	Content map[string]any `json:"content"`
}

// update answers a task's question. Responses to keys not outstanding are
// ignored (the extension's rule), as is an answer to a question someone
// answered first; a decline cancels the task (the question stays open for
// the operator).
func (s *Server) update(ctx context.Context, agentID string, p *updateParams) error {
	t, err := s.handles.get(ctx, agentID, p.TaskID)
	if err != nil {
		return err
	}
	raw, ok := p.InputResponses[answersKey]
	if !ok {
		return nil
	}
	later, err := s.laterOf(t)
	if err != nil {
		return err
	}
	answerer, ok := later.(action.Answerer)
	if !ok {
		return nil
	}
	var r inputResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "inputResponses." + answersKey + ": " + err.Error()}
	}
	if r.Action != "accept" {
		return s.cancelHandle(ctx, t)
	}
	out, err := later.Outcome(ctx, agentID, t.Ref)
	if err != nil {
		return err
	}
	if out.State != action.NeedsInput {
		return nil // answered already
	}
	answers := make([]string, len(out.Questions))
	for i := range answers {
		name := fmt.Sprintf("answer_%d", i+1)
		v, ok := r.Content[name].(string)
		if !ok {
			return &subjects.Error{Code: subjects.CodeInvalidRequest, Message: "inputResponses." + answersKey + ".content." + name + " must be a string"}
		}
		answers[i] = v
	}
	err = answerer.Answer(ctx, agentID, t.Ref, answers)
	if e := subjects.AsError(err); err != nil && strings.HasSuffix(e.Code, "already_answered") {
		return nil
	}
	return err
}

// cancel cancels a task: its record when the feature can end it (a wait),
// and the task in any case.
func (s *Server) cancel(ctx context.Context, agentID, taskID string) error {
	t, err := s.handles.get(ctx, agentID, taskID)
	if err != nil {
		return err
	}
	later, err := s.laterOf(t)
	if err != nil {
		return err
	}
	if err := later.Cancel(ctx, agentID, t.Ref); err != nil && !errors.Is(err, action.ErrNotCancellable) {
		return err
	}
	return s.cancelHandle(ctx, t)
}

func (s *Server) cancelHandle(ctx context.Context, t *handle) error {
	if t.CancelledAt != nil {
		return nil
	}
	t.CancelledAt = new(s.cfg.Now().UTC())
	return s.handles.write(ctx, t)
}

// rpcError is an error as the extension's JSON-RPC error: an unknown or
// expired task is invalid params (-32602), a refused answer too; anything
// else internal.
func rpcError(err error) error {
	if errors.Is(err, errNoTask) {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "Failed to retrieve task: Task not found or expired"}
	}
	var e *subjects.Error
	if errors.As(err, &e) && e.Code != subjects.CodeInternal && e.Code != subjects.CodeUnavailable {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: e.Code + ": " + e.Message}
	}
	if errors.As(err, &e) {
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: e.Code + ": " + e.Message}
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "internal error"}
}
