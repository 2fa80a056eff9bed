package access

import (
	"context"
	"net/http"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/agents"
	"github.com/chime-nats/chime/subjects"
)

// Actions are the agent token actions, served by t (nil: answered
// unavailable).
func (t *Tokens) Actions() []action.Action {
	h := func(fn func(ctx context.Context, agentID string) (any, error)) action.Handler {
		return action.When(t != nil, "agent tokens are not configured", func(ctx context.Context, r action.Request) (any, error) {
			if err := subjects.DecodeNoFields(r.Body); err != nil {
				return nil, err
			}
			return fn(ctx, r.AgentID)
		})
	}
	return []action.Action{
		{Name: agents.ActionTokenIssue, Body: "empty or {}", Reply: "{agent_id, token_id, created_at, token} (the token shown once)", Access: action.Operator, Summary: "issue an agent token (shown once)",
			HTTP:   action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/token", http.StatusCreated, nil),
			Handle: h(func(ctx context.Context, agentID string) (any, error) { return t.Issue(ctx, agentID) })},
		{Name: agents.ActionTokenRevoke, Body: "empty or {}", Reply: "{agent_id, revoked}", Access: action.Operator, Summary: "revoke the agent's tokens and end its connections",
			HTTP:   action.HTTPRoute(http.MethodDelete, action.ControlRoutes+"/token", http.StatusOK, nil),
			Handle: h(func(ctx context.Context, agentID string) (any, error) { return t.Revoke(ctx, agentID) })},
	}
}
