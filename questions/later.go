package questions

import (
	"context"
	"fmt"

	"github.com/chime-nats/chime/action"
)

// later follows a question.ask to its answer, for MCP's tasks: it needs
// input while open (the MCP client may answer it, as may an operator on the
// console, the CLI or HTTP, whichever comes first), and is done with the
// answer's inbox words once answered. A question cannot be withdrawn: a
// task's cancel leaves it open for the operator.
type later struct{ s *Service }

func (l later) Pending(reply any) (string, bool) {
	r, ok := reply.(*AskReply)
	if !ok || r == nil {
		return "", false
	}
	return r.QuestionID, true
}

func (l later) Outcome(ctx context.Context, agentID, questionID string) (action.Outcome, error) {
	q, err := l.s.Get(ctx, agentID, questionID)
	if err != nil {
		return action.Outcome{}, err
	}
	if q.Status != QuestionOpen {
		env := AnswerEnvelope(q)
		return action.Outcome{State: action.Done, Text: env.Text, Data: env.Data, Updated: env.At}, nil
	}
	out := action.Outcome{State: action.NeedsInput, Updated: q.CreatedAt,
		Message: fmt.Sprintf("waiting for the operator's answer to question %s", q.ID)}
	for _, item := range q.Questions {
		out.Questions = append(out.Questions, action.Question{Title: item.Title, Options: item.Options})
	}
	return out, nil
}

// Cancel is not served: a question stays open until answered.
func (l later) Cancel(context.Context, string, string) error { return action.ErrNotCancellable }

func (l later) Answer(ctx context.Context, agentID, questionID string, answers []string) error {
	_, err := l.s.Answer(ctx, agentID, questionID, answers)
	return err
}
