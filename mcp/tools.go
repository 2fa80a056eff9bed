package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/internal/backoff"
	"github.com/chime-nats/chime/prompts"
	"github.com/chime-nats/chime/subjects"
)

// newTool describes a's tool: its description is the action's summary and
// its prompt's opening, its input schema the prompt's arguments for the
// action (a test holds them to the request types).
func newTool(a *action.Action) (*sdk.Tool, error) {
	args, err := prompts.Arguments(a.Tool.Prompt)
	if err != nil {
		return nil, fmt.Errorf("mcp: tool for %s: %w", a.Name, err)
	}
	intro, err := prompts.Intro(a.Tool.Prompt)
	if err != nil {
		return nil, fmt.Errorf("mcp: tool for %s: %w", a.Name, err)
	}
	verb := a.ToolVerb()
	props := map[string]any{}
	required := []string{}
	for _, arg := range args {
		if !arg.Applies(verb) {
			continue
		}
		p := map[string]any{"type": arg.Type, "description": arg.Text}
		if len(arg.Values) > 0 {
			p["enum"] = arg.Values
		}
		props[arg.Name] = p
		if arg.Required {
			required = append(required, arg.Name)
		}
	}
	schema := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		schema["required"] = required
	}
	desc := strings.ToUpper(a.Summary[:1]) + a.Summary[1:] + ". " + intro
	if a.Tool.Later != nil {
		desc += " With the Tasks extension the call returns a task that completes with the outcome."
	}
	return &sdk.Tool{Name: a.ToolName(), Description: desc, InputSchema: schema,
		Annotations: &sdk.ToolAnnotations{OpenWorldHint: new(false)}}, nil
}

// callTool serves a's tool for a client that takes no task: the action's
// reply, or for a later action its outcome within the block bound.
func (s *Server) callTool(a *action.Action) sdk.ToolHandler {
	return func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		agentID := agentOf(ctx)
		reply, res := s.run(ctx, a, agentID, req.Params.Arguments)
		if reply == nil || a.Tool.Later == nil {
			return res, nil
		}
		ref, later := a.Tool.Later.Pending(reply)
		if !later {
			return res, nil
		}
		return s.block(ctx, a, agentID, ref, reply), nil
	}
}

// run runs the action and returns its reply (nil on an error) and the
// tool result that shows it: the reply's JSON, or the error's code and
// message as a tool error the model can act on.
func (s *Server) run(ctx context.Context, a *action.Action, agentID string, args json.RawMessage) (any, *sdk.CallToolResult) {
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	reply, err := s.cfg.Do(ctx, "mcp", a.Name, agentID, args)
	if err != nil {
		return nil, errorResult(err)
	}
	b, err := json.Marshal(reply)
	if err != nil {
		return nil, errorResult(err)
	}
	return reply, &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: string(b)}}, StructuredContent: json.RawMessage(b)}
}

// errorResult is an action's error as a tool error: the model reads the
// code and the message and can correct its call.
func errorResult(err error) *sdk.CallToolResult {
	e := subjects.AsError(err)
	b, _ := json.Marshal(subjects.ErrorReply{Error: e})
	return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: e.Code + ": " + e.Message}},
		StructuredContent: json.RawMessage(b)}
}

// block follows a later call's outcome until it ends or the block bound
// passes: then the outcome, else a receipt naming the record and where its
// outcome will arrive. A blocking call holds one of the agent's event
// streams on this replica (CHIME_MAX_STREAMS_PER_PRINCIPAL): past them, the
// receipt comes at once.
func (s *Server) block(ctx context.Context, a *action.Action, agentID, ref string, reply any) *sdk.CallToolResult {
	if s.cfg.Quotas != nil {
		release, err := s.cfg.Quotas.OpenStream("agent:" + agentID)
		if err != nil {
			return receipt(ref, reply, action.Outcome{})
		}
		defer release()
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Block)
	defer cancel()
	wait := 100 * time.Millisecond
	var last action.Outcome
	for {
		out, err := a.Tool.Later.Outcome(ctx, agentID, ref)
		switch {
		case err == nil:
			last = out
			if out.State == action.Done || out.State == action.Cancelled {
				return outcomeResult(out)
			}
		case ctx.Err() == nil:
			s.log.Warn("following a later call", "agent_id", agentID, "action", a.Name, "ref", ref, "err", err)
		}
		if !backoff.Sleep(ctx, nextLook(wait, last.Due, s.cfg.Now())) {
			return receipt(ref, reply, last)
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// nextLook is how long to wait before reading an outcome again: backing
// off by wait, but looking just after the record's due time when that
// comes sooner (a wait ends about a millisecond after its target).
func nextLook(wait time.Duration, due, now time.Time) time.Duration {
	// An overdue record (a fire running late) is read on the backoff's beat,
	// not hammered.
	if until := due.Sub(now); !due.IsZero() && until > 0 && until+dueSlack < wait {
		return max(until+dueSlack, minLook)
	}
	return wait
}

const (
	// dueSlack is how long after a due time the record is looked at.
	dueSlack = 25 * time.Millisecond
	// minLook is the shortest wait between two reads of one outcome.
	minLook = 25 * time.Millisecond
)

// outcomeResult is an ended outcome as the tool's result: the inbox's words
// and the envelope's data.
func outcomeResult(out action.Outcome) *sdk.CallToolResult {
	res := &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: out.Text}}}
	if raw, ok := out.Data.(json.RawMessage); ok && len(raw) > 0 {
		res.StructuredContent = raw
	}
	return res
}

// receipt answers a later call still going when the block bound passed.
func receipt(ref string, reply any, out action.Outcome) *sdk.CallToolResult {
	b, _ := json.Marshal(reply)
	text := fmt.Sprintf("%s\n\n%s is still going", b, ref)
	if out.Message != "" {
		text += " (" + out.Message + ")"
	}
	text += ". Its outcome will arrive in your inbox, once, with source id " + ref +
		": read it with inbox_fetch, or yield with wait_for until it comes."
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}, StructuredContent: json.RawMessage(b)}
}

// notFound reports an error that says the record is gone.
func notFound(err error) bool {
	var e *subjects.Error
	return errors.As(err, &e) && strings.HasSuffix(e.Code, "_not_found")
}
