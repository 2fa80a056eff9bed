package questions

import (
	"context"
	"net/http"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/quotas"
	"github.com/chime-nats/chime/subjects"
)

// Actions are the question actions, served by s (nil: answered
// unavailable) under q's bound on open questions.
func (s *Service) Actions(q *quotas.Quotas) []action.Action {
	h := func(fn action.Handler) action.Handler {
		return action.When(s != nil, "questions are not configured", fn)
	}
	return []action.Action{
		{Name: ActionQuestionAsk, Tool: &action.Tool{Prompt: "questions.md", Later: later{s}}, Body: "{questions:[{title, options?}], request_id?}", Reply: "{accepted, question_id}", Access: action.Agent, Summary: "ask the operator a question; the answer is delivered to the inbox",
			HTTP:   action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/questions", http.StatusCreated, nil),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) { return s.ask(ctx, q, r) })},
		{Name: ActionQuestionList, Tool: &action.Tool{Prompt: "questions.md"}, Body: "{all?, limit?, cursor?}", Reply: "{questions, next_cursor}", Access: action.Agent, Summary: "list the agent's questions (open ones unless all)",
			Columns: []string{"id", "status", "created_at", "questions", "answers"},
			HTTP: action.HTTPRoute(http.MethodGet, action.AgentRoutes+"/questions", http.StatusOK, func(r *http.Request, _ []byte) []byte {
				m := map[string]any{}
				if all := r.URL.Query().Get("all"); all != "" {
					m["all"] = action.RawBoolOrString(all)
				}
				if c := r.URL.Query().Get("cursor"); c != "" {
					m["cursor"] = c
				}
				return action.WithQuery(r, m, "limit")
			}),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				all, page, err := DecodeListQuestions(r.Body)
				if err != nil {
					return nil, err
				}
				return s.List(ctx, r.AgentID, all, page)
			})},
		{Name: ActionQuestionAnswer, Body: "{question_id, answers} or {question_id, answer}", Reply: "{ok, question}", IDField: "question_id", Access: action.Operator, Summary: "answer an agent's question",
			HTTP: action.HTTPRoute(http.MethodPost, action.ControlRoutes+"/questions/{question_id}/answer", http.StatusOK, func(r *http.Request, read []byte) []byte {
				return WithQuestionID(read, r.PathValue("question_id"))
			}),
			Handle: h(func(ctx context.Context, r action.Request) (any, error) {
				questionID, answers, err := DecodeAnswer(r.Body)
				if err != nil {
					return nil, err
				}
				return s.Answer(ctx, r.AgentID, questionID, answers)
			})},
	}
}

// ask serves question.ask.
func (s *Service) ask(ctx context.Context, q *quotas.Quotas, r action.Request) (any, error) {
	spec, err := DecodeAsk(r.Body)
	if err != nil {
		return nil, err
	}
	// A retry of an ask already stored replays it: it asks nothing new,
	// so the bound does not stand in its way.
	if !action.Replayed(ctx, s.Get, r.AgentID, spec.Request.RequestID, subjects.QuestionIDFor) {
		open, err := s.Open(ctx, r.AgentID)
		if err != nil {
			return nil, err
		}
		if err := q.Question(r.AgentID, open); err != nil {
			return nil, err
		}
	}
	return s.Ask(ctx, r.AgentID, spec)
}
