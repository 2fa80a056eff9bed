package deliveries

import (
	"context"
	"net/http"

	"github.com/chime-nats/chime/action"
)

// Actions are an agent's own reads of its inbox, served by i (nil:
// answered unavailable).
func (i *Inbox) Actions() []action.Action {
	h := func(fn action.Handler) action.Handler {
		return action.When(i != nil, "inbox reads are not configured", fn)
	}
	return []action.Action{
		{Name: ActionInboxFetch, Tool: &action.Tool{Prompt: "inbox.md"}, Body: "{max?, after?, wait_ms?}", Reply: "{deliveries, acked}", Access: action.Agent, Summary: "read the inbox reliably from the agent's cursor",
			HTTP: action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/inbox/fetch", http.StatusOK, action.Query("max", "after", "wait_ms")),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				req, err := DecodeInboxFetch(r.Body)
				if err != nil {
					return nil, err
				}
				return i.Fetch(ctx, r.AgentID, req)
			})},
		{Name: ActionInboxAck, Tool: &action.Tool{Prompt: "inbox.md"}, Body: "{seq}", Reply: "{acked}", Access: action.Agent, Summary: "acknowledge the inbox up to a sequence, moving the cursor",
			HTTP: action.HTTPRoute(http.MethodPost, action.AgentRoutes+"/inbox/ack", http.StatusOK, nil),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				seq, err := DecodeInboxAck(r.Body)
				if err != nil {
					return nil, err
				}
				return i.Ack(ctx, r.AgentID, seq)
			})},
	}
}
