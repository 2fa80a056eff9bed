package api

import (
	"context"
	"net/http"

	"github.com/chime-nats/chime/subjects"
)

// ownWrite reports the one write route an agent may call for itself:
// acking its inbox.
func ownWrite(r *http.Request, agentID string) bool {
	return r.Method == http.MethodPost && r.URL.Path == "/api/agents/"+agentID+"/inbox/ack"
}

// doInbox serves an agent's own read of its inbox.
func (o *Operations) doInbox(ctx context.Context, action, agentID string, body []byte) (any, error) {
	if o.inbox == nil {
		return nil, &subjects.Error{Code: subjects.CodeUnavailable, Message: "inbox reads are not configured"}
	}
	if action == subjects.ActionInboxFetch {
		req, err := subjects.DecodeInboxFetch(body)
		if err != nil {
			return nil, err
		}
		return o.inbox.Fetch(ctx, agentID, req)
	}
	seq, err := subjects.DecodeInboxAck(body)
	if err != nil {
		return nil, err
	}
	return o.inbox.Ack(ctx, agentID, seq)
}
