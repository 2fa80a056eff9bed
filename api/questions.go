package api

import (
	"context"

	"github.com/chime-nats/chime/action"
	"github.com/chime-nats/chime/subjects"
)

// question serves question.ask, question.list and question.answer.
func (o *Operations) question(ctx context.Context, name, agentID string, body []byte) (any, error) {
	if o.questions == nil {
		return nil, &subjects.Error{Code: subjects.CodeUnavailable, Message: "questions are not configured"}
	}
	switch name {
	case subjects.ActionQuestionAsk:
		spec, err := subjects.DecodeAsk(body)
		if err != nil {
			return nil, err
		}
		// A retry of an ask already stored replays it: it asks nothing
		// new, so the bound does not stand in its way.
		if !action.Replayed(ctx, o.questions.Get, agentID, spec.Request.RequestID, subjects.QuestionIDFor) {
			open, err := o.questions.Open(ctx, agentID)
			if err != nil {
				return nil, err
			}
			if err := o.quotas.Question(agentID, open); err != nil {
				return nil, err
			}
		}
		return o.questions.Ask(ctx, agentID, spec)
	case subjects.ActionQuestionList:
		all, page, err := subjects.DecodeListQuestions(body)
		if err != nil {
			return nil, err
		}
		return o.questions.List(ctx, agentID, all, page)
	}
	questionID, answers, err := subjects.DecodeAnswer(body)
	if err != nil {
		return nil, err
	}
	return o.questions.Answer(ctx, agentID, questionID, answers)
}
