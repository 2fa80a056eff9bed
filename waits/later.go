package waits

import (
	"context"
	"fmt"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/subjects"
)

// later follows a wait.request to its end, for MCP's tasks: working until
// the target, then done with the words its inbox delivery carries. A wait
// an operator's intervention ended is done too, not cancelled: its text is
// the operator's, and the agent must read it.
type later struct{ o *Requests }

func (l later) Pending(reply any) (string, bool) {
	r, ok := reply.(WaitReply)
	return r.WaitID, ok
}

func (l later) Outcome(ctx context.Context, agentID, waitID string) (action.Outcome, error) {
	w, err := l.o.store.Get(ctx, agentID, waitID)
	if err != nil {
		return action.Outcome{}, err
	}
	out := action.Outcome{Updated: w.CreatedAt}
	if w.EndedAt != nil {
		out.Updated = *w.EndedAt
	}
	end := WaitEndEnvelope(w, w.CancelText, out.Updated)
	switch {
	case w.Status == WaitCompleted:
		text, err := CompletionText(w)
		if err != nil {
			return action.Outcome{}, err
		}
		out.State, out.Text, out.Data = action.Done, text, end.Data
	case w.Status == WaitCancelled && w.CancelledBy == CancelByRequest:
		out.State, out.Text, out.Data, out.Message = action.Cancelled, w.CancelText, end.Data, w.CancelText
	case w.Status == WaitCancelled:
		out.State, out.Text, out.Data = action.Done, w.CancelText, end.Data
	case w.PausedAt != nil && w.Mode == WaitDuration:
		out.State, out.Message = action.Working, "paused by the operator; the wait's clock stands still until resumed"
	default:
		out.State, out.Due = action.Working, w.TargetTime
		out.Message = fmt.Sprintf("waiting until %s, %s", subjects.FormatISO(w.Target()), RemainingText(w.Remaining(l.o.now()).Seconds()))
	}
	return out, nil
}

func (l later) Cancel(ctx context.Context, agentID, waitID string) error {
	_, err := l.o.Cancel(ctx, agentID, waitID)
	return err
}
