// Package mcp serves each agent's actions to MCP clients (Claude Code,
// Codex, OpenCode, Agent Zero and any MCP SDK) over Streamable HTTP, at
// /api/agents/{id}/mcp on chime's HTTP listener. Its tools are the actions
// the action table offers as tools, described by their prompts; a call
// runs the action exactly as NATS and HTTP do (the same limits, quotas and
// errors). A call whose outcome comes later (a wait, a WaitFor, a question)
// answers a client that declares the Tasks extension
// (io.modelcontextprotocol/tasks) with a task: a handle stored in
// JetStream before the reply, which follows the chime record it stands for
// on any replica and after a restart (tasks.go). A client without the
// extension gets a bounded blocking call that ends in the outcome or, past
// the bound, in a receipt that says where the outcome will arrive.
//
// The server is stateless (MCP revision 2026-07-28) and also answers the
// initialize handshake of the revisions most clients speak (2025-06-18,
// 2025-11-25); the go-sdk does the protocol.
package mcp

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/quotas"
	"github.com/chime-nats/chime/subjects"
)

// TasksExtension is the Tasks extension's identifier (SEP-2663).
const TasksExtension = "io.modelcontextprotocol/tasks"

// Caller runs an action for an agent, as every surface does: limits,
// quotas, metrics and the one error model (api.Operations.Do).
type Caller func(ctx context.Context, surface, action, agentID string, body []byte) (any, error)

// Config configures a Server.
type Config struct {
	// Table lists the actions; those with a Tool are served.
	Table *action.Table
	Do    Caller
	// Handles is the chime_mcp_tasks bucket; JS writes its TTLs.
	Handles jetstream.KeyValue
	JS      jetstream.JetStream
	// Retention is how long a task handle stays after its last refresh (the
	// record retention: a task lives as long as the record it follows);
	// zero keeps handles forever.
	Retention time.Duration
	// Markers is how long a removal's marker stays in the bucket (the
	// engine's marker TTL).
	Markers time.Duration
	// Quotas bounds the tasks an agent holds (nil: no bound).
	Quotas *quotas.Quotas
	// Block bounds a later call of a client without the Tasks extension:
	// within it the call answers with the outcome, past it with a receipt.
	// Zero: DefaultBlock.
	Block time.Duration
	// Version is chime's, as the server names itself.
	Version string
	Now     func() time.Time
	Log     *slog.Logger
}

// DefaultBlock is how long a later call blocks for a client without the
// Tasks extension: under the minute most clients allow a tool call, and
// under the HTTP listener's 60 s write timeout.
const DefaultBlock = 45 * time.Second

// Server is the MCP server of every agent.
type Server struct {
	cfg     Config
	log     *slog.Logger
	tools   map[string]*action.Action // by tool name
	handles *handles
	http    http.Handler
}

// New builds the server and its tools from the table. It does no I/O.
func New(cfg Config) (*Server, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Block <= 0 {
		cfg.Block = DefaultBlock
	}
	if cfg.Markers <= 0 {
		cfg.Markers = time.Minute
	}
	s := &Server{cfg: cfg, log: cfg.Log.With("component", "mcp"), tools: map[string]*action.Action{},
		handles: &handles{kv: cfg.Handles, js: cfg.JS, ttl: cfg.Retention, markers: cfg.Markers, now: cfg.Now}}
	caps := &sdk.ServerCapabilities{Tools: &sdk.ToolCapabilities{}}
	caps.AddExtension(TasksExtension, nil)
	srv := sdk.NewServer(&sdk.Implementation{Name: "chime", Title: "chime", Version: cfg.Version}, &sdk.ServerOptions{
		Capabilities: caps,
		Instructions: instructions,
	})
	var limit int64
	for _, a := range cfg.Table.All() {
		if a.Tool == nil || a.Access != action.Agent || !a.OnNATS() {
			continue
		}
		tool, err := newTool(a)
		if err != nil {
			return nil, err
		}
		if _, dup := s.tools[tool.Name]; dup {
			return nil, fmt.Errorf("mcp: tool %s declared twice", tool.Name)
		}
		s.tools[tool.Name] = a
		srv.AddTool(tool, s.callTool(a))
		limit = max(limit, a.Limit())
	}
	// recoverPanics runs first: a handler's panic must not take the
	// replica down (the SDK runs each request on a goroutine of its own,
	// out of reach of net/http's recovery).
	srv.AddReceivingMiddleware(s.recoverPanics, s.taskCalls)
	if err := s.addTaskMethods(srv); err != nil {
		return nil, err
	}
	s.http = sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, &sdk.StreamableHTTPOptions{
		Stateless: true, JSONResponse: true, Logger: s.log,
		// The largest action body, with room for the JSON-RPC frame; the
		// action's own limit is checked again when it runs.
		MaxRequestBodyBytes: limit + 16<<10,
	})
	return s, nil
}

// recoverPanics turns a handler's panic into a JSON-RPC internal error,
// logged with its stack, as net/http does for chime's other routes.
func (s *Server) recoverPanics(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (res sdk.Result, err error) {
		defer func() {
			if v := recover(); v != nil {
				s.log.Error("panic serving an MCP request", "agent_id", agentOf(ctx), "method", method, "panic", v,
					"stack", string(debug.Stack()))
				res, err = nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "internal error"}
			}
		}()
		return next(ctx, method, req)
	}
}

// instructions tell a model what the server is for, once.
const instructions = "chime gives you timers, waits, background tasks, questions to your operator and " +
	"notifications to your user. Results that come later reach your inbox (inbox_fetch); with the Tasks " +
	"extension, wait, wait_for, wait_for_tasks and question_ask return a task that completes with the result."

// ServeHTTP serves /api/agents/{id}/mcp: the request's tools act for the
// agent {id}. Who may call it (the agent's own token or an operator's) is
// the HTTP guard's rule, as for the agent's other routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	agentID := r.PathValue("id")
	if err := subjects.ValidateID("agent_id", agentID); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	s.http.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), agentKey{}, agentID)))
}

// agentKey holds, in a request's context, the agent whose tools it calls.
type agentKey struct{}

func agentOf(ctx context.Context) string {
	id, _ := ctx.Value(agentKey{}).(string)
	return id
}

func writeError(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(subjects.MarshalError(err))
}
