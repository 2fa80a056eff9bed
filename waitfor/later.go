package waitfor

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/subjects"
	"github.com/chime-nats/chime/tasks"
)

// TaskResults reads finished tasks' results, so that a WaitFor woken by
// task results can say what they were (see later).
type TaskResults interface {
	TaskResult(ctx context.Context, agentID, taskID string) (*subjects.Envelope, error)
}

// later follows a registered WaitFor (wait.for, wait.tasks) to its wake,
// for MCP's tasks: working while it waits, done with the wake's words when
// woken or rechecked, cancelled when replaced, invalidated or stopped. Only
// a registration that made the agent yield is followed: an answer of
// continue_turn or of a report to write is the outcome already.
type later struct{ s *Service }

func (l later) Pending(reply any) (string, bool) {
	r, ok := reply.(*WaitForReply)
	if !ok || r == nil || r.Continuation != YieldAndWait || !r.WaitRegistered {
		return "", false
	}
	return r.WaitID, true
}

func (l later) Outcome(ctx context.Context, agentID, waitID string) (action.Outcome, error) {
	w, err := l.s.cfg.Store.Get(ctx, agentID, waitID)
	if err != nil {
		return action.Outcome{}, err
	}
	out := action.Outcome{Updated: w.UpdatedAt}
	switch {
	case w.Status == WaitForWoken:
		env := WaitWokenEnvelope(w)
		out.State, out.Text, out.Data = action.Done, env.Text, env.Data
		if w.WokenBy != nil && w.WokenBy.Kind == subjects.KindTaskResult {
			if more, err := l.results(ctx, w); err != nil {
				return action.Outcome{}, err
			} else if more != "" {
				out.Text += "\n\n" + more
			}
		}
	case w.Live() && w.RecheckSent:
		env := RecheckEnvelope(w, w.UpdatedAt)
		out.State, out.Text, out.Data = action.Done, env.Text, env.Data
	case w.Live():
		out.State, out.Message = action.Working, fmt.Sprintf("waiting for %s: %s", w.Wake, w.Reason)
	default:
		reason := w.EndReason
		if reason == "" {
			reason = string(w.Status)
		}
		out.State, out.Message = action.Cancelled, fmt.Sprintf("WaitFor %s ended: %s", w.ID, reason)
		out.Text = out.Message
	}
	return out, nil
}

// results are the words of the task results that woke w: the woken task's
// for mode any and a single task, every task's for mode all.
func (l later) results(ctx context.Context, w *WaitFor) (string, error) {
	r, ok := l.s.cfg.Tasks.(TaskResults)
	if !ok {
		return "", nil
	}
	ids := w.Resources
	if w.Mode != WaitModeAll || len(ids) == 0 {
		ids = []string{w.WokenBy.Source.ID}
	}
	var parts []string
	for _, id := range ids {
		env, err := r.TaskResult(ctx, w.AgentID, id)
		if err != nil {
			return "", err
		}
		if env != nil {
			parts = append(parts, ResultText(env))
		}
	}
	return strings.Join(parts, "\n\n"), nil
}

// ResultText is a task_result envelope in words a model reads on its own:
// its text, then the error and the output it carries (the output's start,
// and where the rest is, when it is stored apart).
func ResultText(env *subjects.Envelope) string {
	var d tasks.TaskResultData
	_ = json.Unmarshal(env.Data, &d)
	var b strings.Builder
	b.WriteString(env.Text)
	if d.Error != "" {
		fmt.Fprintf(&b, "\nError: %s", d.Error)
	}
	if d.Output != "" {
		fmt.Fprintf(&b, "\nOutput:\n%s", d.Output)
	}
	if d.OutputRef != "" {
		fmt.Fprintf(&b, "\n(The output is %d bytes; the above is its start. Read the rest with task_output, task_id %s.)", d.OutputSize, d.TaskID)
	}
	return b.String()
}

// Cancel is not served: a registration ends by its wake, or by a newer
// WaitFor in its scope.
func (l later) Cancel(context.Context, string, string) error { return action.ErrNotCancellable }
